"""Translates a file (or stdin) with an exported SavedModel.

    python -m pipelines.translate --model saved_models/default < input.en > output.de

`--model` is a version folder (`saved_models/default/1`) or a model folder,
whose highest version is used. Sentences are sorted by length into batches,
translated with the SavedModel's `translate` signature, and written back in
input order, one line per input line (an empty line gives an empty line).
Progress goes to stderr.
"""

import argparse
import os
import sys
import time

import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops the SavedModel uses

from pipelines.corpus import DataError


def saved_versions(base_dir):
    """The integer version folders under `base_dir` (TF Serving's layout), as ints."""
    if not os.path.isdir(base_dir):
        return []
    return [int(name) for name in os.listdir(base_dir) if name.isdigit()]


def resolve_version(path):
    """A SavedModel folder: `path` itself, or its highest integer version."""
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    versions = saved_versions(path)
    if not versions:
        raise DataError(f"no SavedModel at {path} (expected saved_model.pb or NAME/VERSION/)")
    return os.path.join(path, str(max(versions)))


def translate_lines(signature, lines, beam_size=4, alpha=0.6, batch_size=1024, progress=None):
    """Translates byte strings in batches of similar length, returning them in order.

    Args:
        signature: the SavedModel's `translate` signature.
        lines: list of bytes, one sentence each.
        beam_size: int, 1 for greedy search.
        alpha: float, length penalty exponent.
        batch_size: int, sentences per call; the SavedModel sorts a call's
            sentences by length and searches them in chunks.
        progress: callable(done, total) or None.

    Returns:
        `(translations, scores)`: lists of str and float in input order.
    """
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    translations, scores = [None] * len(lines), [None] * len(lines)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        outputs = signature(
            inputs=tf.constant([lines[i] for i in batch], tf.string),
            beam_size=tf.constant(beam_size, tf.int32),
            alpha=tf.constant(alpha, tf.float32),
        )
        for i, text, score in zip(
            batch, outputs["translations"].numpy(), outputs["scores"].numpy(), strict=True
        ):
            translations[i], scores[i] = text.decode("utf-8"), float(score)
        if progress:
            progress(min(start + batch_size, len(order)), len(order))
    return translations, scores


def _progress(started):
    def report(done, total):
        rate = done / max(time.time() - started, 1e-9)
        end = "\n" if done == total else "\r"
        print(f"translated {done}/{total} sentences ({rate:.1f}/s)", end=end, file=sys.stderr)

    return report


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.translate",
        description="Translates lines with an exported SavedModel (`kt-translate`).",
    )
    parser.add_argument("--model", required=True, help="saved_models/NAME or NAME/VERSION")
    parser.add_argument("--input", help="a text file; defaults to stdin")
    parser.add_argument("--output", help="defaults to stdout")
    parser.add_argument("--beam-size", type=int, default=4, help="1 for greedy search")
    parser.add_argument("--alpha", type=float, default=0.6, help="length penalty exponent")
    parser.add_argument(
        "--batch-size", type=int, default=1024, help="sentences per call of the SavedModel"
    )
    args = parser.parse_args(argv)
    try:
        if args.beam_size < 1 or args.batch_size < 1:
            raise DataError("--beam-size and --batch-size must be positive")
        path = resolve_version(args.model)
        if args.input and not os.path.isfile(args.input):
            raise DataError(f"input file not found: {args.input}")
        source = open(args.input, "rb") if args.input else sys.stdin.buffer
        with source:
            lines = [line.rstrip(b"\r\n") for line in source]
        signature = tf.saved_model.load(path).signatures["translate"]
        show = _progress(time.time()) if len(lines) > args.batch_size else None
        translations, _ = translate_lines(
            signature, lines, args.beam_size, args.alpha, args.batch_size, show
        )
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = "".join(f"{line}\n" for line in translations)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
