"""A long run in small: resume cost early and late, the disk a run leaves, validation's share.

Usage:
    python benchmarks/long_run.py --output-dir /tmp/long-run
    python benchmarks/long_run.py --output-dir /tmp/long-run \\
        --multi30k-dir ../shared/data/multi30k   # adds the multi30k recipe's validation cost

A tiny model on the embedded corpus trains `--steps` steps over many passes,
validating every `--validate-every` steps with a greedy decode of
`--validation-sentences` sentences, one checkpoint an epoch, `--keep` of
them kept. It runs twice, one after the other:

  whole    uninterrupted (`kt train` in a process of its own);
  killed   the same command as a child process, killed (SIGKILL) once it
           has backed up step `--early`, rerun, killed again after step
           `--late`, rerun to the end.

`--resume-only` leaves the uninterrupted run out (a late resume's cost
alone, in half the time). It reports the time from each resumed
process's start to its first trained step (the target: a late resume
within 1.2x of an early one), the bytes the run folder holds at its end
against the weights' bytes, validation's share of training time, and
whether the killed run ended on the uninterrupted
run's weights (then it trained on the same batches, with the same dropout).

With `--multi30k-dir`, the multi30k recipe trains `--recipe-steps` steps
validating `--recipe-sentences` sentences greedily every `--recipe-steps //
2`; validation's share of 1,000 training steps is reported from the step
time and one validation's time (an early model decodes longer sentences
than a trained one, so the share is an upper bound).

Writes benchmarks/results/long_run.json.
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, ROOT, folder_bytes, table, write_result  # noqa: E402

# The benchmark's model: the default recipe, small, on 6,000 embedded pairs.
TINY = [
    "--set", "default_corpus_sizes=[6000,500,100]",
    "--set", "model.num_layers=2",
    "--set", "model.hidden_dim=64",
    "--set", "model.intermediate_dim=128",
    "--batch-tokens", "512",
    "--vocabulary-size", "400",
    "--heldout-split", "none",
]  # fmt: skip


def backed_up_step(run_dir):
    from pipelines.training.backup import backup_folders

    folders = backup_folders(os.path.join(run_dir, "backup"))
    return folders[-1][0] if folders else 0


FIRST_STEP = re.compile(r"First step of this process: step (\d+), ([\d.]+) s after")


def first_step(log):
    """`(step, seconds)` of the log's first trained step after its start, or None."""
    match = FIRST_STEP.search(log)
    return (int(match.group(1)), float(match.group(2))) if match else None


def kill_after(command, run_dir, step, log_path, timeout=3600):
    """Runs `command` until it has backed up `step`, then kills it; returns its log."""
    started = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log)
        while backed_up_step(run_dir) < step and process.poll() is None:
            if time.perf_counter() - started > timeout:
                break
            time.sleep(0.2)
        if process.poll() is not None:
            raise SystemExit(f"the run ended before step {step} was backed up: see {log_path}")
        process.send_signal(signal.SIGKILL)
        process.wait()
    with open(log_path, encoding="utf-8") as log:
        return log.read()


def run_to_end(command, timeout=7200):
    """Runs `command` to its end; raises on failure."""
    finished = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    if finished.returncode:
        raise SystemExit(f"{' '.join(command)} failed:\n{finished.stderr[-3000:]}")
    return finished


def weights_bytes(model_path):
    import keras

    import keras_transformer  # noqa: F401  registers the classes model.keras names

    model = keras.saving.load_model(model_path)
    return sum(w.nbytes for w in model.get_weights()), model


def same_weights(first, second):
    import numpy as np

    pairs = zip(first.get_weights(), second.get_weights(), strict=True)
    return max(float(np.max(np.abs(a - b))) for a, b in pairs)


def resume_study(args):
    flags = ["--steps", str(args.steps), "--steps-per-epoch", str(args.validate_every),
             "--backup-every", str(args.backup_every), "--keep-checkpoints", str(args.keep),
             "--validation-sentences", str(args.validation_sentences), *TINY]  # fmt: skip
    whole_dir = os.path.join(args.output_dir, "whole")
    killed_dir = os.path.join(args.output_dir, "killed")
    logs = {
        name: os.path.join(args.output_dir, f"{name}.log") for name in ("first", "early", "late")
    }
    if not args.measure_only:
        if not args.resume_only:
            # A process of its own, as the killed run's are (a caller's devices do not leak in).
            whole_run = [sys.executable, "-m", "pipelines", "train", "--output-dir", whole_dir]
            run_to_end([*whole_run, *flags])
        child = [sys.executable, "-m", "pipelines", "train", "--output-dir", killed_dir, *flags]
        kill_after(child, killed_dir, args.early, logs["first"])
        # Resumes from the early backup, killed once it backed up the late step.
        kill_after(child, killed_dir, args.late, logs["early"])
        resumed = run_to_end(child)  # resumes from the late backup, to the end
        with open(logs["late"], "w", encoding="utf-8") as handle:
            handle.write(resumed.stderr)
    whole_path = os.path.join(whole_dir, "result.json")
    whole = None if args.resume_only else json.load(open(whole_path, encoding="utf-8"))
    killed = json.load(open(os.path.join(killed_dir, "result.json"), encoding="utf-8"))
    early = first_step(open(logs["early"], encoding="utf-8").read())
    # The late resume's start-up, as its result says (and its log, where kept).
    late = (killed["resumed_at_step"] + 1, killed["seconds_to_first_step"])
    late_log = open(logs["late"], encoding="utf-8").read() if os.path.exists(logs["late"]) else ""
    weights, killed_model = weights_bytes(os.path.join(killed_dir, "model.keras"))
    difference = None
    if whole is not None:
        _, whole_model = weights_bytes(os.path.join(whole_dir, "model.keras"))
        difference = same_weights(whole_model, killed_model)
    checkpoints = os.path.join(killed_dir, "checkpoints")
    epoch_files = [f for f in os.listdir(checkpoints) if f.startswith("epoch-")]
    epoch_bytes = [os.path.getsize(os.path.join(checkpoints, f)) for f in epoch_files]
    run_bytes = folder_bytes(killed_dir) - folder_bytes(os.path.join(killed_dir, "data"))
    return {
        "settings": {
            "steps": args.steps,
            "validate_every": args.validate_every,
            "backup_every": args.backup_every,
            "keep_checkpoints": args.keep,
            "validation_sentences": args.validation_sentences,
            "epochs": args.steps // args.validate_every,
        },
        "whole_run_seconds": whole and round(whole["seconds"], 1),
        "resume": {
            # The first step after a resume at step n is step n + 1.
            "early_step": early[0] - 1,
            "late_step": late[0] - 1,
            "early_seconds_to_first_step": early[1],
            "late_seconds_to_first_step": late[1],
            "late_over_early": round(late[1] / early[1], 3),
            "fresh_run_seconds_to_first_step": whole and whole["seconds_to_first_step"],
            "resumed_at_step": killed["resumed_at_step"],
            "backed_up_before_kills": [early[0] - 1, late[0] - 1],
            "max_weight_difference_to_uninterrupted": difference,
            "skipped_batches": "Skipping" in late_log or "Skipping" in open(logs["early"]).read(),
        },
        "disk": {
            "weights_bytes": weights,
            "checkpoint_files": sorted(os.listdir(checkpoints)),
            "epoch_checkpoints_kept": len(epoch_files),
            "epoch_checkpoint_over_weights": round(max(epoch_bytes) / weights, 4),
            "backup_bytes": folder_bytes(os.path.join(killed_dir, "backup")),
            "checkpoints_bytes": folder_bytes(checkpoints),
            "run_bytes_without_data": run_bytes,
            "run_over_weights": round(run_bytes / weights, 2),
        },
        "validation": whole
        and {
            "seconds": whole["validation_seconds"],
            "training_seconds": whole["training_seconds"],
            "share": round(whole["validation_seconds"] / whole["training_seconds"], 4),
            "backup_seconds": whole["backup_seconds"],
        },
    }


def recipe_validation(args):
    from pipelines.commands import train as command

    folder = os.path.join(args.output_dir, "multi30k")
    every = args.recipe_steps // 2
    flags = ["--recipe", "multi30k", "--multi30k-dir", args.multi30k_dir, "--output-dir", folder,
             "--steps", str(args.recipe_steps), "--steps-per-epoch", str(every),
             "--max-minutes", "null", "--validation-sentences", str(args.recipe_sentences),
             "--heldout-split", "none"]  # fmt: skip
    if command.main(flags):
        raise SystemExit("the multi30k run failed")
    result = json.load(open(os.path.join(folder, "result.json"), encoding="utf-8"))
    weights, _ = weights_bytes(os.path.join(folder, "model.keras"))
    checkpoint = os.path.join(folder, "checkpoints", "epoch-001.keras")
    validations = len(result["history"]["val_bleu"])
    one = result["validation_seconds"] / validations
    step = (result["training_seconds"] - result["validation_seconds"]) / args.recipe_steps
    return {
        "steps": args.recipe_steps,
        "validation_sentences": args.recipe_sentences,
        "step_seconds": round(step, 4),
        "one_validation_seconds": round(one, 2),
        "share_every_1000_steps": round(one / (1000 * step + one), 4),
        "val_bleu": result["history"]["val_bleu"],
        "weights_bytes": weights,
        "epoch_checkpoint_over_weights": round(os.path.getsize(checkpoint) / weights, 4),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", default="runs/long-run")
    parser.add_argument("--steps", type=int, default=21_000)
    parser.add_argument("--validate-every", type=int, default=210)
    parser.add_argument("--backup-every", type=int, default=100)
    parser.add_argument("--keep", type=int, default=10, help="keep_checkpoints")
    parser.add_argument("--validation-sentences", type=int, default=100)
    parser.add_argument("--early", type=int, default=200, help="the first kill's backup step")
    parser.add_argument("--late", type=int, default=20_000, help="the second kill's backup step")
    parser.add_argument("--multi30k-dir", help="also cost validation on the multi30k recipe")
    parser.add_argument("--recipe-steps", type=int, default=200)
    parser.add_argument("--recipe-sentences", type=int, default=500)
    parser.add_argument(
        "--output",
        help="default: results/long_run.json (--resume-only: results/long_run_resume.json)",
    )
    parser.add_argument(
        "--resume-only",
        action="store_true",
        help="the killed run alone: no uninterrupted run to compare weights and costs with",
    )
    parser.add_argument(
        "--measure-only",
        action="store_true",
        help="report from the runs already in --output-dir (train and kill nothing)",
    )
    args = parser.parse_args(argv)
    name = "long_run_resume.json" if args.resume_only else "long_run.json"
    args.output = args.output or os.path.join(RESULTS, name)
    os.makedirs(args.output_dir, exist_ok=True)
    result = {"command": "python benchmarks/long_run.py " + " ".join(argv or sys.argv[1:])}
    result.update(resume_study(args))
    if args.multi30k_dir:
        result["multi30k_validation"] = recipe_validation(args)
    write_result(result, args.output)
    resume, disk = result["resume"], result["disk"]
    print(table(
        ["figure", "value"],
        [
            ["resume at step", f"{resume['early_step']} / {resume['late_step']}"],
            ["seconds to the first step", f"{resume['early_seconds_to_first_step']} / "
             f"{resume['late_seconds_to_first_step']}"],
            ["late over early", resume["late_over_early"]],
            ["largest weight difference", resume["max_weight_difference_to_uninterrupted"]],
            ["epoch checkpoints kept", disk["epoch_checkpoints_kept"]],
            ["epoch checkpoint / weights", disk["epoch_checkpoint_over_weights"]],
            ["run folder / weights", disk["run_over_weights"]],
            ["validation share", (result["validation"] or {}).get("share")],
        ],
    ))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
