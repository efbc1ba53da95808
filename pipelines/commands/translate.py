"""Translates a file (or stdin) with an exported SavedModel.

    kt translate --model saved_models/default < input.en > output.de
    kt translate --model saved_models/default --input test.en --output test.de

`--model` is a version folder (`saved_models/default/1`) or a model folder,
whose highest version is used. The input is translated `--batch-size`
sentences at a time, in input order (the SavedModel sorts each batch by
length), one line per input line (an empty line gives an empty line); each
batch's lines are written as soon as it is done. Progress goes to stderr.

With `--output`, finished lines go to `OUTPUT.partial` first and the file
takes its name only when complete. A run that is killed can be restarted
with the same arguments: it keeps the lines already in `OUTPUT.partial` and
continues after them (when the input, model and settings are the same; else
it starts over).
"""

import contextlib
import hashlib
import json
import os
import sys
import time

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.errors import ConfigError
from pipelines.files import check_input_file, prepare_output_file, write_json


def _progress(total):
    started, terminal = time.time(), sys.stderr.isatty()

    def report(done):
        rate = done / max(time.time() - started, 1e-9)
        end = "\r" if terminal and done < total else "\n"
        print(f"translated {done}/{total} sentences ({rate:.1f}/s)", end=end, file=sys.stderr)

    return report


def _identity(version):
    """A SavedModel version folder's path and its graph file's size and time."""
    graph = os.stat(os.path.join(version, "saved_model.pb"))
    return [os.path.abspath(version), graph.st_size, graph.st_mtime_ns]


def _resume_point(partial, state):
    """Lines of `partial` to keep: those of an earlier run with the same `state`, else 0."""
    sidecar = f"{partial}.json"
    try:
        with open(sidecar, encoding="utf-8") as handle:
            same = json.load(handle) == state
        with open(partial, "rb") as handle:
            data = handle.read()
    except (OSError, ValueError):
        same, data = False, b""
    if not same:
        # Emptied before the new state is recorded: a kill in between leaves
        # no lines under a state they do not belong to.
        with open(partial, "wb") as handle:
            os.fsync(handle.fileno())
        write_json(sidecar, state)
        return 0
    complete = data[: data.rfind(b"\n") + 1]  # a line cut by the kill is redone
    with open(partial, "r+b") as handle:
        handle.truncate(len(complete))
    return complete.count(b"\n")


def _translate(args):
    if args.beam_size < 1 or args.batch_size < 1:
        raise ConfigError(
            f"--beam-size and --batch-size must be positive. "
            f"Received: {args.beam_size}, {args.batch_size}"
        )
    if args.input:
        check_input_file(args.input, "--input")
    if args.output:
        prepare_output_file(args.output, "--output")
    from pipelines.serving import client  # imports TensorFlow

    version, signature = client.load_signature(args.model)
    source = open(args.input, "rb") if args.input else sys.stdin.buffer
    with source:
        data = source.read()
    lines = [line.rstrip(b"\r") for line in data.split(b"\n")]
    if lines and lines[-1] == b"":
        lines.pop()  # the final line break ends the last line
    with contextlib.ExitStack() as stack:
        done, out = 0, sys.stdout
        if args.output:
            partial = f"{args.output}.partial"
            state = {
                "input_sha256": hashlib.sha256(data).hexdigest(),
                "model": _identity(version),
                "beam_size": args.beam_size,
                "alpha": args.alpha,
            }
            done = _resume_point(partial, state)
            if done:
                print(f"resuming after {done} lines already in {partial}", file=sys.stderr)
            out = stack.enter_context(open(partial, "a", encoding="utf-8"))
        _write_translations(args, signature, lines, done, out)
    if args.output:
        os.replace(partial, args.output)
        os.remove(f"{partial}.json")


def _write_translations(args, signature, lines, done, out):
    """Translates `lines[done:]` a batch at a time, writing each batch's lines as it ends."""
    from pipelines.serving import client

    show = _progress(len(lines)) if len(lines) > args.batch_size else None
    for start in range(done, len(lines), args.batch_size):
        batch = lines[start : start + args.batch_size]
        translations, _ = client.translate_lines(
            signature, batch, args.beam_size, args.alpha, args.batch_size
        )
        out.write("".join(f"{line}\n" for line in translations))
        out.flush()
        if out is not sys.stdout:
            os.fsync(out.fileno())
        if show:
            show(start + len(batch))


def main(argv=None, prog="kt translate"):
    parser = command_parser(prog, __doc__)
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
