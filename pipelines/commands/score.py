"""Scores given translations with an exported SavedModel: one log-probability a line.

    kt score --model saved_models/default --source test.en --target test.de --output scores.txt

Forced decoding: each line of `--target` is scored as the translation of the
same line of `--source`, by the SavedModel's `score` signature: the sum of its
tokens' log-probabilities, end of sentence included, with no length penalty
(divide by the token count for a per-token score; `--lengths` prints it
beside each score). Uses: filtering a parallel corpus, reranking n-best
lists, checking translations. Lines are written in input order.
"""

import sys

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.data.corpus import read_lines
from pipelines.errors import ConfigError, DataError
from pipelines.files import atomic_text, check_input_file, prepare_output_file


def _score(args):
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be positive. Received: {args.batch_size}")
    check_input_file(args.source, "--source")
    check_input_file(args.target, "--target")
    if args.output:
        prepare_output_file(args.output, "--output")
    sources, targets = read_lines(args.source), read_lines(args.target)
    if len(sources) != len(targets):
        raise DataError(
            f"--source {args.source} has {len(sources)} lines but --target {args.target} "
            f"has {len(targets)}"
        )
    import tensorflow as tf

    from pipelines.serving import client  # imports TensorFlow

    _, signature = client.load_signature(args.model, "score")
    lines = []
    for start in range(0, len(sources), args.batch_size):
        outputs = signature(
            sources=tf.constant(sources[start : start + args.batch_size]),
            targets=tf.constant(targets[start : start + args.batch_size]),
        )
        for score, length in zip(
            outputs["scores"].numpy(), outputs["lengths"].numpy(), strict=True
        ):
            lines.append(f"{score:.6f}\t{length}\n" if args.lengths else f"{score:.6f}\n")
    if args.output:
        with atomic_text(args.output) as handle:
            handle.writelines(lines)
    else:
        sys.stdout.writelines(lines)


def main(argv=None, prog="kt score"):
    parser = command_parser(prog, __doc__)
    parser.add_argument("--model", required=True, help="saved_models/NAME or NAME/VERSION")
    parser.add_argument("--source", required=True, help="source sentences, one a line")
    parser.add_argument("--target", required=True, help="their translations, aligned")
    parser.add_argument("--output", help="defaults to stdout")
    parser.add_argument("--lengths", action="store_true", help="also print each token count")
    parser.add_argument("--batch-size", type=int, default=1024, help="pairs per call")
    return run(_score, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
