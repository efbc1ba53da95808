"""The ptb recipe end to end: train, export, parse the held-out splits, score them.

Usage:
    python benchmarks/ptb_recipe.py --treebank-dir ../shared/data/treebank \
        --output-dir runs/ptb [--skip-training] [--beam-size 21 --alpha 0.3]

Runs the product's own commands, each in a fresh process, and times the whole:
    kt train --recipe ptb --treebank-dir D --output-dir R
    kt export --run-dir R --base R/saved_models --name NAME
    kt parse --model R/saved_models/NAME --input SPLIT.words --output SPLIT.trees
    kt parseval --trees SPLIT.trees --treebank D --split SPLIT
for the dev split and, where the treebank holds its files, the test split;
the right-branching baseline is scored on the same sentences. The export
searches with the run's settings (the recipe's beam 21, alpha 0.3, output
limit source + 600) unless --beam-size / --alpha say otherwise. Writes
benchmarks/results/ptb_recipe.json and prints the scores.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import RESULTS, set_flags, stage_environment, write_result  # noqa: E402
from pipelines.commands.stages import run_stage  # noqa: E402


def _score(treebank, split, trees, path, env):
    flags = ["--trees", trees] if trees else ["--right-branching"]
    arguments = [*flags, "--treebank", treebank, "--split", split, "--output", path]
    run_stage(f"Score the {split} trees", "parseval", arguments, env)
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--treebank-dir", required=True)
    parser.add_argument("--output-dir", default="runs/ptb")
    parser.add_argument("--skip-training", action="store_true", help="score an existing run")
    parser.add_argument("--set", action="append", default=[], help="training --set overrides")
    parser.add_argument("--name", default="ptb", help="the export's name under RUN/saved_models")
    parser.add_argument("--beam-size", type=int, help="defaults to the run's (21)")
    parser.add_argument("--alpha", type=float, help="defaults to the run's (0.3)")
    parser.add_argument("--output", default=os.path.join(RESULTS, "ptb_recipe.json"))
    args = parser.parse_args(argv)

    from pipelines.parsing.trees import read_trees

    env = stage_environment()
    run, treebank = os.path.abspath(args.output_dir), os.path.abspath(args.treebank_dir)
    started, seconds = time.perf_counter(), {}
    if not args.skip_training:
        flags = ["--recipe", "ptb", "--treebank-dir", treebank, "--output-dir", run]
        seconds["training"] = run_stage(
            "Train the ptb recipe", "train", [*flags, *set_flags(args.set)], env
        )
    search = [flag for name in ("beam_size", "alpha") if getattr(args, name) is not None
              for flag in (f"--{name.replace('_', '-')}", str(getattr(args, name)))]  # fmt: skip
    export = os.path.join(run, "saved_models", args.name)
    seconds["export"] = run_stage(
        "Export the parser",
        "export",
        ["--run-dir", run, "--base", os.path.dirname(export), "--name", args.name, *search],
        env,
    )
    splits = {}
    for split in ("dev", "test"):
        gold = read_trees(treebank, split)
        if not gold:
            continue  # the test files are kept aside
        scratch = os.path.join(run, args.name, split)
        os.makedirs(scratch, exist_ok=True)
        words = os.path.join(scratch, f"{split}.words")
        with open(words, "w", encoding="utf-8") as handle:
            handle.writelines(" ".join(tree.leaves()) + "\n" for tree in gold)
        trees = os.path.join(scratch, f"{split}.trees")
        seconds[f"parse_{split}"] = run_stage(
            f"Parse the {split} sentences",
            "parse",
            ["--model", export, "--input", words, "--output", trees],
            env,
        )
        splits[split] = {
            "sentences": len(gold),
            "parser": _score(treebank, split, trees, os.path.join(scratch, "scores.json"), env),
            "right_branching": _score(
                treebank, split, None, os.path.join(scratch, "baseline.json"), env
            ),
        }
    seconds["whole"] = round(time.perf_counter() - started, 1)
    with open(os.path.join(run, "result.json"), encoding="utf-8") as handle:
        trained = json.load(handle)
    from pipelines.serving.client import export_settings  # imports TensorFlow
    from pipelines.serving.versions import resolve_version

    write_result(
        {
            "benchmark": "ptb_recipe",
            "command": "python benchmarks/ptb_recipe.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": run,
            "steps": trained.get("steps"),
            "seconds": seconds,
            "search": export_settings(resolve_version(export)),  # as the export records it
            "splits": splits,
            "greedy_parse_from_training": trained.get("greedy_parse"),
        },
        args.output,
    )
    for split, found in splits.items():
        parser_f1 = found["parser"]["all"]["f1"]
        baseline = found["right_branching"]["all"]["f1"]
        print(f"{split}: labelled F1 {parser_f1:.2f} (right-branching {baseline:.2f})")
    print(f"whole command {seconds['whole'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())
