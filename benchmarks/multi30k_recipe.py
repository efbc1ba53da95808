"""The Multi30k recipe end to end: train, export, translate test_2016_flickr, score.

Usage:
    python benchmarks/multi30k_recipe.py --multi30k-dir ../shared/data/multi30k \
        --output-dir runs/multi30k [--skip-training]

Runs the product's own commands, each in a fresh process:
    kt train --recipe multi30k --multi30k-dir D --output-dir R
    kt export --run-dir R --base R/saved_models --name multi30k
    kt translate --model R/saved_models/multi30k --input test.en ...
    kt evaluate (cased, then --lowercase)
Training runs with TF_ENABLE_ONEDNN_OPTS=1 (as `make train`) and is timed;
with --skip-training an existing run is scored and its time is read from its
result.json (or given with --training-seconds). Translation is the
SavedModel's beam search (beam 4, alpha 0.6). Writes
benchmarks/results/multi30k_recipe.json and prints the scores.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    set_flags,
    stage_environment,
    write_multi30k_split,
    write_result,
)
from pipelines.commands.stages import export_translate_score, run_stage  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--multi30k-dir", required=True)
    parser.add_argument("--output-dir", default="runs/multi30k")
    parser.add_argument("--skip-training", action="store_true", help="score an existing run")
    parser.add_argument("--training-seconds", type=float, help="with --skip-training")
    parser.add_argument("--set", action="append", default=[], help="training --set overrides")
    parser.add_argument("--test-sentences", type=int, help="score only the first N (smoke runs)")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--output", default=os.path.join(RESULTS, "multi30k_recipe.json"))
    args = parser.parse_args(argv)

    env = stage_environment()
    run = os.path.abspath(args.output_dir)
    multi30k = os.path.abspath(args.multi30k_dir)
    seconds = {}
    if not args.skip_training:
        flags = ["--recipe", "multi30k", "--multi30k-dir", multi30k, "--output-dir", run]
        seconds["training"] = run_stage(
            "Train the multi30k recipe", "train", [*flags, *set_flags(args.set)], env
        )
    with open(os.path.join(run, "result.json"), encoding="utf-8") as handle:
        trained = json.load(handle)
    if args.skip_training:
        seconds["training"] = args.training_seconds or trained.get("seconds")

    scratch = os.path.join(run, "test_2016_flickr")
    os.makedirs(scratch, exist_ok=True)
    source, reference, sentences = write_multi30k_split(
        multi30k, "test_2016_flickr", scratch, args.test_sentences
    )
    stage_seconds, scores = export_translate_score(
        run,
        os.path.join(run, "saved_models", "multi30k"),
        source,
        reference,
        os.path.join(scratch, "test_2016_flickr"),
        env,
        beam_size=args.beam_size,
        alpha=args.alpha,
        lowercase=True,
    )
    seconds.update(stage_seconds)
    result = write_result(
        {
            "benchmark": "multi30k_recipe",
            "command": "python benchmarks/multi30k_recipe.py " + " ".join(argv or sys.argv[1:]),
            "run_dir": run,
            "steps": trained.get("steps"),
            "seconds": seconds,
            "training_minutes": round(seconds["training"] / 60, 1) if seconds["training"] else None,
            "test_sentences": sentences,
            "beam_size": args.beam_size,
            "alpha": args.alpha,
            "test_2016_flickr": scores,
            "greedy_bleu_from_training": trained.get("greedy_bleu"),
        },
        args.output,
    )
    print(
        f"test_2016_flickr BLEU {scores['cased']['bleu']:.2f} cased, "
        f"{scores['lowercased']['bleu']:.2f} lowercased; "
        f"training {result['training_minutes']} min"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
