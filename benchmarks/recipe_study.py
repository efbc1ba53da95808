"""Multi30k recipe study: training variants at one time budget, scored on `val` only.

Usage:
    python benchmarks/recipe_study.py --multi30k-dir ../shared/data/multi30k \
        --minutes 14 --variant NAME KEY=VALUE ... [--variant ...] [--output-dir runs/study]
    python benchmarks/recipe_study.py --multi30k-dir ../shared/data/multi30k \
        --decoding runs/multi30k [--average 1 3 5 8] [--beams 1:0 4:0.6 4:1.0 5:0.6]

Each variant is the `multi30k` recipe with `--set KEY=VALUE` overrides,
trained by the product's train command (fresh process, oneDNN on, as `make
train`) under `--max-minutes`, so every variant gets the same wall-clock
time and spends it on as many updates as its settings allow. Each trained
model (its averaged checkpoints) then translates Multi30k `val` greedily;
BLEU is lowercased sacreBLEU, as the recipe's target. Nothing here reads a
test set: settings are chosen on these numbers. Appends each variant's row to
`--output` (benchmarks/results/recipe_study.json) as soon as it is scored,
so a long study can be stopped and resumed (`--skip-done`).

With `--decoding RUN_DIR` it studies what happens after training instead, on
one finished run: the mean of its last N epoch checkpoints for each
`--average` N, each translated on `val` with each `--beams SIZE:ALPHA`
(size 1 is greedy search), written to `decoding` in the same file.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, write_result  # noqa: E402
from pipelines.commands.stages import run_stage  # noqa: E402


def parse_value(raw):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def val_set(run_dir, multi30k_dir):
    """`(tokenizer, max_length, pairs)`: what translating Multi30k val with a run needs."""
    from pipelines.data import tokenizer
    from pipelines.data.corpus import load_multi30k
    from pipelines.training.recorded import run_max_length

    max_length = run_max_length(run_dir)
    tok = tokenizer.load_tokenizer(os.path.join(run_dir, "sentencepiece.model"))
    return tok, max_length, load_multi30k(multi30k_dir, "validation")


def val_bleu(model, val, beam_size=1, alpha=0.0):
    """`(lowercased, cased)` BLEU of `model` on a `val_set`."""
    from pipelines.evaluation import score, translate

    tok, max_length, pairs = val
    sources = [s for s, _ in pairs]
    hypotheses = translate(model, tok, sources, max_source_length=max_length, beam_size=beam_size,
                           alpha=alpha)  # fmt: skip
    references = [t for _, t in pairs]
    lowercased = score(hypotheses, references, lowercase=True)["bleu"]
    return lowercased, score(hypotheses, references)["bleu"]


def decoding_study(run_dir, multi30k_dir, averages, beams):
    """Val BLEU for each number of averaged checkpoints and each (beam, alpha)."""
    import tempfile

    from pipelines.training.checkpoints import average_checkpoints, epoch_checkpoints

    checkpoints = epoch_checkpoints(os.path.join(run_dir, "checkpoints"))
    val = val_set(run_dir, multi30k_dir)
    rows = []
    for count in averages:
        with tempfile.TemporaryDirectory() as scratch:
            model = average_checkpoints(checkpoints[-count:], os.path.join(scratch, "m.keras"))
        for beam in beams:
            size, alpha = beam.split(":")
            lowercased, cased = val_bleu(model, val, int(size), float(alpha))
            rows.append(
                {
                    "averaged_checkpoints": count,
                    "beam_size": int(size),
                    "alpha": float(alpha),
                    "val_bleu_lowercased": lowercased,
                    "val_bleu_cased": cased,
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--minutes", type=float, help="each variant's budget")
    parser.add_argument("--variant", nargs="+", action="append", metavar="NAME [KEY=VALUE]")
    parser.add_argument("--decoding", metavar="RUN_DIR", help="study averaging and beams")
    parser.add_argument("--average", type=int, nargs="+", default=[1, 3, 5, 8])
    parser.add_argument("--beams", nargs="+", default=["1:0", "4:0.6", "4:1.0", "5:0.6"])
    parser.add_argument("--output-dir", default="runs/study")
    parser.add_argument("--skip-done", action="store_true", help="keep rows already written")
    parser.add_argument("--output", default=os.path.join(RESULTS, "recipe_study.json"))
    args = parser.parse_args(argv)

    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
    env.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    study = {"benchmark": "recipe_study", "rows": []}
    if os.path.exists(args.output):
        with open(args.output, encoding="utf-8") as handle:
            study = json.load(handle)
    multi30k = os.path.abspath(args.multi30k_dir)
    if args.decoding:
        study["decoding"] = {
            "run_dir": os.path.abspath(args.decoding),
            "rows": decoding_study(args.decoding, multi30k, args.average, args.beams),
        }
        write_result(study, args.output)
        return 0
    if not (args.variant and args.minutes):
        parser.error("give --minutes and --variant, or --decoding")
    for name, *settings in args.variant:
        done = [row for row in study["rows"] if row["variant"] == name]
        if args.skip_done and done:
            continue
        run = os.path.abspath(os.path.join(args.output_dir, name))
        flags = ["--recipe", "multi30k", "--multi30k-dir", multi30k, "--output-dir", run]
        # The study scores val itself: the run decodes no held-out split at its end.
        flags += ["--max-minutes", str(args.minutes), "--set", "output.heldout_split=none"]
        flags += [item for setting in settings for item in ("--set", setting)]
        seconds = run_stage(f"Variant {name}", "train", flags, env)
        with open(os.path.join(run, "result.json"), encoding="utf-8") as handle:
            trained = json.load(handle)
        from pipelines.training.checkpoints import load_checkpoint

        model = load_checkpoint(os.path.join(run, "model.keras"))
        lowercased, cased = val_bleu(model, val_set(run, multi30k))
        row = {
            "variant": name,
            "settings": dict(
                (key, parse_value(value))
                for key, _, value in (setting.partition("=") for setting in settings)
            ),
            "budget_minutes": args.minutes,
            "command_minutes": round(seconds / 60, 1),
            "steps": trained["steps"],
            "final_train_loss": trained["history"]["loss"][-1],
            "final_val_loss": trained["history"].get("val_loss", [None])[-1],
            "val_bleu_greedy_lowercased": lowercased,
            "val_bleu_greedy_cased": cased,
        }
        study["rows"] = [r for r in study["rows"] if r["variant"] != name] + [row]
        write_result(study, args.output)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
