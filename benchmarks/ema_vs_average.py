"""A moving average of the weights against checkpoint averaging, on the multi30k recipe.

Usage:
    python benchmarks/ema_vs_average.py --multi30k-dir ../shared/data/multi30k \\
        --output-dir /tmp/ema-run/run --steps 10000 --ema 0.999

One run gives both final models. The `multi30k` recipe trains `--steps`
updates (a fixed count, so the result does not depend on the machine's
speed; the recipe's cooldown ends there) with `ema: --ema`, and its
`model.keras` is the recipe's average (the last 70% of the epoch
checkpoints, which hold the trained weights, not the moving average). The
finished run is then run again with `select: ema`: it trains nothing more
and writes the moving average, read from its backup, as `model.keras`. Each
model is exported from a folder of its own and translates `val` (where a
choice would be made) and test_2016_flickr with the SavedModel (beam 4,
alpha 0.6), scored by sacreBLEU, cased and lowercased.

With an existing, finished run in `--output-dir` the training command trains
nothing and only the comparison runs. Writes
benchmarks/results/ema_vs_average.json.
"""

import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    set_flags,
    stage_environment,
    table,
    write_multi30k_split,
    write_result,
)
from pipelines.commands.stages import export_translate_score, run_stage  # noqa: E402

SPLITS = ("val", "test_2016_flickr")


def model_folder(run, name):
    """A folder holding `run`'s current `model.keras` with the files its export reads."""
    folder = os.path.join(run, "compared", name)
    os.makedirs(folder, exist_ok=True)
    for file in ("model.keras", "config.json", "sentencepiece.model", "result.json"):
        shutil.copyfile(os.path.join(run, file), os.path.join(folder, file))
    return folder


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--output-dir", default="runs/ema-vs-average")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--ema", type=float, default=0.999, help="the moving average's decay")
    parser.add_argument("--sentences", type=int, help="score only the first N (smoke runs)")
    parser.add_argument("--set", action="append", default=[], help="training --set overrides")
    parser.add_argument("--output", default=os.path.join(RESULTS, "ema_vs_average.json"))
    args = parser.parse_args(argv)

    env = stage_environment()
    run = os.path.abspath(args.output_dir)
    multi30k = os.path.abspath(args.multi30k_dir)
    train = ["--recipe", "multi30k", "--multi30k-dir", multi30k, "--output-dir", run,
             "--steps", str(args.steps), "--max-minutes", "null", "--ema", str(args.ema),
             *set_flags(args.set)]  # fmt: skip
    seconds = {"training": run_stage("Train the multi30k recipe with a moving average", "train",
                                     [*train, "--select", "average"], env)}  # fmt: skip
    folders = {"average": model_folder(run, "average")}
    # The finished run again: no step more, its moving average into model.keras.
    seconds["ema"] = run_stage("The moving average", "train", [*train, "--select", "ema"], env)
    folders["ema"] = model_folder(run, "ema")
    with open(os.path.join(run, "result.json"), encoding="utf-8") as handle:
        trained = json.load(handle)

    data = os.path.join(run, "compared", "data")
    os.makedirs(data, exist_ok=True)
    scores = {name: {} for name in folders}
    for split in SPLITS:
        source, reference, _ = write_multi30k_split(multi30k, split, data, args.sentences)
        for name, folder in folders.items():
            _, scored = export_translate_score(
                folder, os.path.join(folder, "saved_models", name), source, reference,
                os.path.join(folder, split), env, lowercase=True, signatures=["translate"],
            )  # fmt: skip
            scores[name][split] = {case: round(s["bleu"], 2) for case, s in scored.items()}
    result = write_result(
        {
            "benchmark": "ema_vs_average",
            "command": "python benchmarks/ema_vs_average.py " + " ".join(argv or sys.argv[1:]),
            "steps": trained["steps"],
            "ema": args.ema,
            "sentences": args.sentences,
            "seconds": seconds,
            "bleu": scores,
            "lowercased_ema_minus_average": {
                split: round(
                    scores["ema"][split]["lowercased"] - scores["average"][split]["lowercased"], 2
                )
                for split in SPLITS
            },  # fmt: skip
        },
        args.output,
    )
    rows = [[name, *(f"{scores[name][s]['lowercased']} / {scores[name][s]['cased']}"
                     for s in SPLITS)] for name in folders]  # fmt: skip
    print(table(["model.keras", "val BLEU (lower / cased)", "test_2016_flickr"], rows))
    return 0 if result else 1


if __name__ == "__main__":
    sys.exit(main())
