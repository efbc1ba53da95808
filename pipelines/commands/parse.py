"""Parses sentences into Penn Treebank trees with an exported parser (the `ptb` recipe).

    kt parse --model saved_models/ptb --input dev.words --output dev.trees

The input holds one sentence a line, its words separated by spaces as the
treebank tokenises them (`Pierre Vinken , 61 years old , ...`). The output
holds one bracketed tree a line, in input order, rooted at `TOP`, with the
input words at its leaves and the tags the model predicts (or the `XX`
placeholder of a model trained without them):

    (TOP (S (NP (XX Pierre) (XX Vinken)) ...))

The SavedModel's `serving_default` writes each sentence's tree linearised;
output that is not a well-formed tree over the words is repaired (stray
brackets dropped, open ones closed, left-over words attached to the root,
a word token outside the vocabulary's tags written `XX`), and how many
outputs needed it is reported on stderr. Brackets in words are written
`-LRB-` and `-RRB-`, as the treebank writes them. Score the trees with
`kt parseval`. Like `kt translate`, finished lines go to `OUTPUT.partial`
and a killed run restarted with the same arguments resumes.
"""

import contextlib
import hashlib
import os
import sys

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.commands.resumable import (
    export_identity,
    read_input_lines,
    resume_point,
    write_lines,
)
from pipelines.errors import ConfigError
from pipelines.files import check_input_file, prepare_output_file


def _parse(args):
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be positive. Received: {args.batch_size}")
    check_input_file(args.input, "--input")
    if args.output:
        prepare_output_file(args.output, "--output")
    from pipelines.parsing import trees
    from pipelines.parsing.corpus import parse_lines, vocabulary_tags
    from pipelines.serving import client  # imports TensorFlow

    version, signature = client.load_signature(args.model, "serving_default")
    tags = vocabulary_tags(os.path.join(version, "assets", "sentencepiece.model"))
    with_words = client.export_settings(version)["tree_words"]
    with open(args.input, "rb") as handle:
        data = handle.read()
    # The model reads words as the treebank writes them: brackets as -LRB- and -RRB-.
    sentences = [
        trees.escape_brackets(line.decode("utf-8", errors="replace"))
        for line in read_input_lines(data)
    ]
    lines = [sentence.encode("utf-8") for sentence in sentences]
    repaired, done = 0, 0
    with contextlib.ExitStack() as stack:
        out = sys.stdout
        if args.output:
            state = {
                "input_sha256": hashlib.sha256(data).hexdigest(),
                "model": export_identity(version),
            }
            partial = f"{args.output}.partial"
            done = resume_point([(partial, 1)], state)
            if done:
                print(f"resuming after {done} lines already parsed", file=sys.stderr)
            out = stack.enter_context(open(partial, "a", encoding="utf-8"))
        for start in range(done, len(lines), args.batch_size):
            batch = sentences[start : start + args.batch_size]
            outputs = client.call_in_batches(signature, lines[start : start + len(batch)])
            linearised = [text.decode("utf-8") for text in outputs["translations"]]
            parsed, count = parse_lines(linearised, batch, tags, with_words)
            repaired += count
            write_lines(out, [trees.to_bracketed(tree) for tree in parsed])
            print(f"parsed {start + len(batch)}/{len(lines)} sentences", file=sys.stderr)
    if args.output:
        os.replace(f"{args.output}.partial", args.output)
        os.remove(f"{args.output}.partial.json")
    share = 100.0 * repaired / max(len(lines) - done, 1)
    print(
        f"{repaired} of {len(lines) - done} outputs ({share:.2f}%) were repaired into trees",
        file=sys.stderr,
    )


def main(argv=None, prog="kt parse"):
    parser = command_parser(prog, __doc__)
    parser.add_argument("--model", required=True, help="saved_models/NAME or NAME/VERSION")
    parser.add_argument("--input", required=True, help="one sentence a line, words spaced")
    parser.add_argument("--output", help="one bracketed tree a line; defaults to stdout")
    parser.add_argument(
        "--batch-size", type=int, default=256, help="sentences per call of the SavedModel"
    )
    return run(_parse, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
