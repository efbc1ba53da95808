"""The whole product in one command, offline: train, export, translate, score.

    python -m pipelines.demo        # what `make demo` runs

1. trains the default recipe on the embedded corpus (`pipelines.train`),
2. exports a SavedModel to `saved_models/NAME/VERSION/` (`pipelines.export`),
3. translates the held-out split with that SavedModel in a fresh process
   that loads only TensorFlow and the export (`pipelines.translate`),
4. scores it with sacreBLEU (`pipelines.evaluate`) and prints examples.

Each stage is the command a user would run, started as its own process.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from pipelines.corpus import read_lines


def _stage(title, argv):
    print(f"\n== {title}\n$ {' '.join(argv)}", flush=True)
    started = time.time()
    result = subprocess.run([sys.executable, "-m", *argv])
    if result.returncode != 0:
        raise SystemExit(f"error: {title} failed (exit {result.returncode})")
    return time.time() - started


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m pipelines.demo", description=__doc__)
    parser.add_argument("--output-dir", default="runs/demo")
    parser.add_argument("--base", default="saved_models", help="where exports go")
    parser.add_argument("--name", default="default", help="the exported model's name")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], help="training KEY=VALUE")
    args = parser.parse_args(argv)
    run = args.output_dir
    train = ["pipelines.train", "--recipe", "default", "--output-dir", run]
    for item in args.set:
        train += ["--set", item]
    times = {"train": _stage("Train the default recipe", train)}
    export = ["pipelines.export", "--run-dir", run, "--base", args.base, "--name", args.name]
    export += ["--beam-size", str(args.beam_size)]
    times["export"] = _stage("Export a SavedModel for TF Serving", export)
    source, target = os.path.join(run, "heldout.source"), os.path.join(run, "heldout.target")
    translation = os.path.join(run, "heldout.translation")
    times["translate"] = _stage(
        "Translate the held-out split with the SavedModel",
        ["pipelines.translate", "--model", os.path.join(args.base, args.name), "--input", source,
         "--output", translation, "--beam-size", str(args.beam_size)],
    )  # fmt: skip
    scores_path = os.path.join(run, "heldout.scores.json")
    times["evaluate"] = _stage(
        "Score it with sacreBLEU",
        ["pipelines.evaluate", "--hypotheses", translation, "--references", target,
         "--output", scores_path],
    )  # fmt: skip
    with open(scores_path, encoding="utf-8") as handle:
        scores = json.load(handle)
    rows = [read_lines(path) for path in (source, translation, target)]
    print("\n== Examples from the exported model")
    for src, hyp, ref in list(zip(*rows, strict=True))[: args.examples]:
        mark = "=" if hyp == ref else "!"
        print(f"  {src}\n  {mark} {hyp}\n    (reference: {ref})")
    print(
        f"\nHeld-out BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} on "
        f"{scores['sentences']} sentences; stages took "
        + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
