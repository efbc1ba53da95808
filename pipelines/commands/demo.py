"""The whole product in one command, offline: train, export, translate, score.

    kt demo        # what `make demo` runs

1. trains the default recipe on the embedded corpus (`kt train`),
2. exports a SavedModel to `saved_models/NAME/VERSION/` (`kt export`),
3. translates the held-out split with that SavedModel in a fresh process
   that loads only TensorFlow and the export (`kt translate`),
4. scores it with sacreBLEU (`kt evaluate`) and prints examples.

Each stage is the command a user would run, started as its own process.
"""

import os
import sys

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.commands.stages import export_translate_score, run_stage
from pipelines.data.corpus import read_lines


def _demo(args):
    run_dir = args.output_dir
    train = ["--recipe", "default", "--output-dir", run_dir]
    for item in args.set:
        train += ["--set", item]
    times = {"train": run_stage("Train the default recipe", "train", train)}
    source, target = (
        os.path.join(run_dir, "heldout.source"),
        os.path.join(run_dir, "heldout.target"),
    )
    prefix = os.path.join(run_dir, "heldout")
    seconds, scores = export_translate_score(
        run_dir,
        os.path.join(args.base, args.name),
        source,
        target,
        prefix,
        beam_size=args.beam_size,
    )
    times.update(seconds)
    scores = scores["cased"]
    rows = [read_lines(path) for path in (source, f"{prefix}.translation", target)]
    print("\n== Examples from the exported model")
    for src, hyp, ref in list(zip(*rows, strict=True))[: args.examples]:
        mark = "=" if hyp == ref else "!"
        print(f"  {src}\n  {mark} {hyp}\n    (reference: {ref})")
    print(
        f"\nHeld-out BLEU {scores['bleu']:.2f}, chrF {scores['chrf']:.2f} on "
        f"{scores['sentences']} sentences; stages took "
        + ", ".join(f"{k} {v:.0f} s" for k, v in times.items())
    )


def main(argv=None, prog="kt demo"):
    parser = command_parser(prog, __doc__)
    parser.add_argument("--output-dir", default="runs/demo")
    parser.add_argument("--base", default="saved_models", help="where exports go")
    parser.add_argument("--name", default="default", help="the exported model's name")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--examples", type=int, default=5)
    parser.add_argument("--set", action="append", default=[], help="training KEY=VALUE")
    return run(_demo, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
