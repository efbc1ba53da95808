"""Translates a file (or stdin) with an exported SavedModel.

    kt translate --model saved_models/default < input.en > output.de

`--model` is a version folder (`saved_models/default/1`) or a model folder,
whose highest version is used. Sentences are sorted by length into batches,
translated with the SavedModel's `translate` signature, and written back in
input order, one line per input line (an empty line gives an empty line).
Progress goes to stderr.
"""

import os
import sys
import time

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.errors import ConfigError, DataError


def _progress(started):
    def report(done, total):
        rate = done / max(time.time() - started, 1e-9)
        end = "\n" if done == total else "\r"
        print(f"translated {done}/{total} sentences ({rate:.1f}/s)", end=end, file=sys.stderr)

    return report


def _translate(args):
    if args.beam_size < 1 or args.batch_size < 1:
        raise ConfigError(
            f"--beam-size and --batch-size must be positive. "
            f"Received: {args.beam_size}, {args.batch_size}"
        )
    if args.input and not os.path.isfile(args.input):
        raise DataError(f"input file not found: {args.input}")
    from pipelines.serving import client  # imports TensorFlow

    signature = client.load_signature(args.model)
    source = open(args.input, "rb") if args.input else sys.stdin.buffer
    with source:
        lines = [line.rstrip(b"\r\n") for line in source]
    show = _progress(time.time()) if len(lines) > args.batch_size else None
    translations, _ = client.translate_lines(
        signature, lines, args.beam_size, args.alpha, args.batch_size, show
    )
    text = "".join(f"{line}\n" for line in translations)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)


def main(argv=None, prog="kt translate"):
    parser = command_parser(prog, __doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="saved_models/NAME or NAME/VERSION")
    parser.add_argument("--input", help="a text file; defaults to stdin")
    parser.add_argument("--output", help="defaults to stdout")
    parser.add_argument("--beam-size", type=int, default=4, help="1 for greedy search")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    parser.add_argument(
        "--batch-size", type=int, default=1024, help="sentences per call of the SavedModel"
    )
    return run(_translate, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
