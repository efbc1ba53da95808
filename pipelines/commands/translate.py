"""Translates a file (or stdin) with an exported SavedModel.

    kt translate --model saved_models/default < input.en > output.de
    kt translate --model saved_models/default --input test.en --output test.de

`--model` is a version folder (`saved_models/default/1`) or a model folder,
whose highest version is used. The input is translated `--batch-size`
sentences at a time, in input order (the SavedModel sorts each batch by
length), one line per input line (an empty line gives an empty line); each
batch's lines are written as soon as it is done. Progress goes to stderr.

Search: the export's beam size and length penalty by default
(`serving_default`); `--beam-size`, `--alpha` and `--penalty-form` (gnmt or
power) choose others (`translate`).

Target prefixes: `--prefix-file` holds one prefix per input line (an empty
line for none); each translation starts with its prefix (`prefix`).

Alignments: `--alignments FILE` writes, for each line, the pairs `i-j` of a
source word `i` and a translation word `j` that attends to it most (words
are whitespace-separated, counted from 0; fast_align's format) (`align`),
with the export's beam size and length penalty.

Decoding controls: `--no-repeat-ngram-size N`, `--repetition-penalty P`,
`--min-length N`, `--max-output-length N` (pieces, the end included; the
training setting `max_length` is another thing: the longest training pair;
`--max-length` is still accepted), `--disable-unk`
and `--banned-words FILE` (one word or phrase a line, never produced) cut each
step's distribution (`controlled`).

Controls and prefixes combine with `--beam-size`, `--alpha`, `--penalty-form`
and each other (`controlled_search`), and with sampling
(`controlled_sample`); alignments take none of them.

Sampling (back-translation): any of `--sampling-topk`, `--sampling-topp`,
`--sampling-temperature` or `--num-samples` draws translations from the
model's distribution instead of searching (`sample`); `--num-samples N`
writes N lines per input line. The samples depend only on `--seed`, the
line and its number: a run is reproducible, and resumes exactly.

Input lines that are not valid UTF-8 are translated with their invalid bytes
replaced by U+FFFD (as the SavedModel does), and a warning on stderr names
them by line number.

With `--output`, finished lines go to `OUTPUT.partial` first (`ALIGNMENTS.partial`
beside it) and the files take their names only when complete. A run that is
killed can be restarted with the same arguments: it keeps the lines already
written and continues after them (when the input, model and settings are the
same; else it starts over). Without `--output` (translations to stdout), a rerun
translates everything again, `--alignments` included. A second run started
onto the same `--output` (or `--alignments`) while one writes it is refused,
naming the first run's process id (`OUTPUT.lock`).
"""

import contextlib
import hashlib
import os
import sys
import time

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.commands.resumable import (
    export_identity,
    read_input_lines,
    resume_point,
    write_lines,
)
from pipelines.errors import ConfigError, DataError, ExportError
from pipelines.files import check_input_file, output_lock, prepare_output_file

SAMPLING_FLAGS = ("sampling_topk", "sampling_topp", "sampling_temperature", "num_samples")
CONTROL_FLAGS = (
    "no_repeat_ngram_size", "repetition_penalty", "min_length", "max_length", "disable_unk",
    "banned_words",
)  # fmt: skip


def _flag(name):
    if name == "max_length":  # the output's cap, not training's max_length
        return "--max-output-length"
    return f"--{name.replace('_', '-')}"


def _progress(total):
    started, terminal = time.time(), sys.stderr.isatty()

    def report(done):
        rate = done / max(time.time() - started, 1e-9)
        end = "\r" if terminal and done < total else "\n"
        print(f"translated {done}/{total} sentences ({rate:.1f}/s)", end=end, file=sys.stderr)

    return report


def _check_settings(args):
    """Refuses settings that are out of range or do not go together, before any work."""
    given = {name for name in vars(args) if getattr(args, name) is not None}
    sampling = bool(given & set(SAMPLING_FLAGS))
    positive = [("--batch-size", args.batch_size), ("--beam-size", args.beam_size),
                ("--num-samples", args.num_samples)]  # fmt: skip
    for flag, value in positive:
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be positive. Received: {value}")
    if args.alpha is not None and not args.alpha >= 0:
        raise ConfigError(f"--alpha must be 0 or positive. Received: {args.alpha}")
    if args.sampling_temperature is not None and not args.sampling_temperature > 0:
        raise ConfigError(
            f"--sampling-temperature must be positive. Received: {args.sampling_temperature}"
        )
    if args.sampling_topk is not None and args.sampling_topk < 0:
        raise ConfigError(
            f"--sampling-topk must be 0 (no cut) or positive. Received: {args.sampling_topk}"
        )
    if args.sampling_topp is not None and not 0 < args.sampling_topp <= 1:
        raise ConfigError(f"--sampling-topp must be in (0, 1]. Received: {args.sampling_topp}")
    searched = [_flag(name) for name in ("beam_size", "alpha", "penalty_form") if name in given]
    controlled = [_flag(name) for name in CONTROL_FLAGS if name in given]
    _check_controls(args)
    if sampling and searched:
        raise ConfigError(f"{searched[0]} does not apply to sampling (--sampling-*, --num-samples)")
    if args.seed is not None and not sampling:
        raise ConfigError("--seed applies to sampling only (--sampling-*, --num-samples)")
    if args.seed is not None and args.seed < 0:
        raise ConfigError(f"--seed must be 0 or positive. Received: {args.seed}")
    others = searched + controlled  # `align` takes prefixes, with the export's search
    if args.alignments and (others or sampling):
        raise ConfigError(
            f"{(others or ['--sampling-*'])[0]} does not apply with --alignments, which searches "
            "with the export's beam size and length penalty (kt export --beam-size, --alpha)"
        )
    return sampling


def _check_controls(args):
    """Refuses decoding controls out of range (`--min-length` above `--max-output-length` too)."""
    if all(getattr(args, name) is None for name in CONTROL_FLAGS):
        return
    from keras_transformer.decoding.controls import DecodingControls  # imports Keras

    if args.max_length is not None and args.max_length < 1:
        raise ConfigError(f"--max-output-length must be positive. Received: {args.max_length}")
    given = {name: getattr(args, name) for name in DecodingControls.SETTINGS}
    for valid, message, names in DecodingControls.rules({
        name: value if value is not None else DecodingControls.SETTINGS[name][1]
        for name, value in given.items()
    }):  # fmt: skip
        if valid or any(given[name] is None for name in names):
            continue
        if len(names) == 2:  # min_length and max_length
            raise ConfigError(
                f"--min-length {args.min_length} is above --max-output-length {args.max_length}"
            )
        flag = _flag(names[0])
        raise ConfigError(f"{flag}{message.removeprefix(names[0])}. Received: {given[names[0]]}")


def _banned_words(path):
    """`--banned-words FILE`'s words and phrases, one a line, joined by newlines."""
    with open(path, "rb") as handle:
        lines = handle.read().splitlines()
    for number, line in enumerate(lines, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise DataError(
                f"--banned-words {path}, line {number}: not UTF-8 ({error.reason})"
            ) from None
    text = "\n".join(line.decode("utf-8").strip() for line in lines if line.strip())
    return text.removeprefix("\ufeff")  # a byte-order mark is not part of the first word


def _check_prefixes(args, version, lines, prefixes, source_name, settings):
    """Refuses a prefix file of another length, or a prefix longer than its output limit.

    The limit is the export's: the source's pieces, end of sentence included and
    cut at `max_source_length` as the export cuts them, plus `extra_length`.
    """
    if len(prefixes) != len(lines):
        raise DataError(
            f"--prefix-file {args.prefix_file} has {len(prefixes)} lines but {source_name} "
            f"has {len(lines)}"
        )
    import sentencepiece

    from pipelines.data.vocabularies import target_vocabulary_path

    source_path = os.path.join(version, "assets", "sentencepiece.model")
    tokenizer = sentencepiece.SentencePieceProcessor(model_file=source_path)
    target = sentencepiece.SentencePieceProcessor(model_file=target_vocabulary_path(source_path))
    extra_length, max_source = settings["extra_length"], settings.get("max_source_length")
    fixed, ends = settings["max_output_length"], int(settings["end_at_limit"])
    for number, (line, prefix) in enumerate(zip(lines, prefixes, strict=True), start=1):
        if not prefix:
            continue
        pieces = len(target.encode(prefix.decode("utf-8", errors="replace")))
        source = len(tokenizer.encode(line.decode("utf-8", errors="replace"))) + 1
        limit = fixed or (min(source, max_source) if max_source else source) + extra_length
        cut = f", cut at {max_source}" if max_source and source > max_source else ""
        what = f"(its source's pieces, end of sentence included{cut}, plus {extra_length})"
        if pieces > limit - ends:  # with a forced end, the last piece is the end's
            raise DataError(
                f"--prefix-file {args.prefix_file}, line {number}: the prefix has {pieces} "
                f"pieces, more than the {limit - ends} its sentence may produce "
                f"{'before its forced end ' if ends else ''}"
                f"{'(the export limit)' if fixed else what}"
            )


def _keep_export_settings(args, exported):
    """Sets `--beam-size` or `--alpha`, the one not given, to the export's (`exported`)."""
    args.beam_size = exported["beam_size"] if args.beam_size is None else args.beam_size
    args.alpha = exported["alpha"] if args.alpha is None else args.alpha


def _translate(args):
    sampling = _check_settings(args)
    inputs = (("--input", args.input), ("--prefix-file", args.prefix_file),
              ("--banned-words", args.banned_words))  # fmt: skip
    for flag, path in inputs:
        if path:
            check_input_file(path, flag)
    banned = _banned_words(args.banned_words) if args.banned_words else ""
    outputs = [(flag, path) for flag, path in (("--output", args.output),
               ("--alignments", args.alignments)) if path]  # fmt: skip
    for flag, path in outputs:
        prepare_output_file(path, flag)
    if (
        args.alignments
        and args.output
        and os.path.abspath(args.alignments) == os.path.abspath(args.output)
    ):
        raise ConfigError(f"--alignments and --output are the same file: {args.output}")
    with contextlib.ExitStack() as locks:  # one run writes a file at a time
        for flag, path in outputs:
            locks.enter_context(output_lock(path, flag))
        _translate_files(args, sampling, banned)


def _warn_invalid_utf8(lines, name):
    """Warns, on stderr, of input lines that are not UTF-8 (translated with U+FFFD)."""
    bad = []
    for number, line in enumerate(lines, start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError:
            bad.append(number)
    if bad:
        shown = ", ".join(str(number) for number in bad[:10]) + (", ..." if len(bad) > 10 else "")
        print(
            f"warning: {name}: {len(bad)} lines are not valid UTF-8 (lines {shown}); their "
            "invalid bytes are translated as U+FFFD",
            file=sys.stderr,
        )


def _signature_name(args, sampling):
    """The signature that does what the flags ask (see the module docstring)."""
    controlled = any(getattr(args, flag) is not None for flag in CONTROL_FLAGS)
    searched = any(getattr(args, f) is not None for f in ("beam_size", "alpha", "penalty_form"))
    if sampling:
        return "controlled_sample" if controlled or args.prefix_file else "sample"
    if args.alignments:
        return "align"
    if (controlled and (searched or args.prefix_file)) or (searched and args.prefix_file):
        return "controlled_search"
    if controlled:
        return "controlled"
    if args.prefix_file:
        return "prefix"
    return "translate" if searched else "serving_default"


def _translate_files(args, sampling, banned):
    from pipelines.serving import client  # imports TensorFlow

    name = _signature_name(args, sampling)
    version, signature = client.load_signature(args.model, name)
    source = open(args.input, "rb") if args.input else sys.stdin.buffer
    with source:
        data = source.read()
    lines = read_input_lines(data)
    prefixes, prefix_data = None, b""
    if args.prefix_file:
        with open(args.prefix_file, "rb") as handle:
            prefix_data = handle.read()
        prefixes = read_input_lines(prefix_data)
        limits = client.export_settings(version)
        if name == "controlled_sample":  # sampling keeps each sentence's own limit
            limits = {**limits, "max_output_length": 0, "end_at_limit": False}
        source_name = f"--input {args.input or 'stdin'}"
        _check_prefixes(args, version, lines, prefixes, source_name, limits)
    elif name in ("align", "controlled_search", "controlled_sample"):
        prefixes = [b""] * len(lines)
    _warn_invalid_utf8(lines, f"--input {args.input}" if args.input else "stdin")  # checks passed
    samples = args.num_samples or 1
    if name in ("translate", "controlled_search"):
        _keep_export_settings(args, client.export_settings(version))
        if args.penalty_form and not client.takes(signature, "penalty_form"):
            raise ExportError(
                f"--penalty-form: the export {version} predates it (its translate signature "
                "has no penalty_form input): export the model again"
            )
    with contextlib.ExitStack() as stack:
        done, out, alignments = 0, sys.stdout, None
        if args.output or args.alignments:
            state = {
                "input_sha256": hashlib.sha256(data).hexdigest(),
                "prefixes_sha256": hashlib.sha256(prefix_data).hexdigest(),
                "model": export_identity(version),
                "signature": name,
                **{
                    key: getattr(args, key)
                    for key in ("beam_size", "alpha", "penalty_form", "seed")
                },
                **{key: getattr(args, key) for key in SAMPLING_FLAGS + CONTROL_FLAGS},
                "banned_words_sha256": hashlib.sha256(banned.encode()).hexdigest(),
            }
            partials = [(f"{path}.partial", per) for path, per in
                        ((args.output, samples), (args.alignments, 1)) if path]  # fmt: skip
            # Translations written to stdout cannot be resumed: a rerun writes them
            # all again, and the alignments beside them.
            done = resume_point(partials, state, resume=bool(args.output))
            if done:
                print(f"resuming after {done} lines already translated", file=sys.stderr)
            files = [stack.enter_context(open(path, "a", encoding="utf-8")) for path, _ in partials]
            out = files.pop(0) if args.output else sys.stdout
            alignments = files.pop(0) if args.alignments else None
        batches = _batches(args, name, signature, lines, prefixes, done, samples, banned)
        show = _progress(len(lines)) if len(lines) > args.batch_size else None
        for end, texts, aligned in batches:
            write_lines(out, texts)
            if alignments is not None:
                write_lines(alignments, aligned)
            if show:
                show(end)
    for path in (args.output, args.alignments):
        if path:
            os.replace(f"{path}.partial", path)
    if args.output or args.alignments:
        os.remove(f"{partials[0][0]}.json")


def _control_rows(args, count, banned):
    """The controls' inputs for `count` sentences: the flags, or neutral values."""
    from pipelines.serving.controls import CONTROLS

    values = {name: getattr(args, name) for name in CONTROLS if name != "banned_words"}
    values["banned_words"] = banned
    return {
        name: ([neutral if values[name] is None else values[name]] * count, dtype)
        for name, (dtype, neutral) in CONTROLS.items()
    }


def _batches(args, name, signature, lines, prefixes, done, samples, banned=""):
    """Yields `(lines done, output lines, alignment lines)` for each batch after `done`."""
    import numpy as np
    import tensorflow as tf

    from pipelines.serving import client

    batch_size = max(1, args.batch_size // samples)
    for start in range(done, len(lines), batch_size):
        batch = lines[start : start + batch_size]
        end = start + len(batch)
        rows, scalars = {}, {}
        if name in ("translate", "controlled_search"):
            scalars = {
                "beam_size": tf.constant(args.beam_size),
                "alpha": tf.constant(args.alpha, tf.float32),
            }
            if client.takes(signature, "penalty_form"):  # exports before it lack the input
                scalars["penalty_form"] = tf.constant(args.penalty_form or "")  # "": the export's
        if name.startswith("controlled"):
            rows = _control_rows(args, len(batch), banned)
        if name in ("prefix", "align", "controlled_search"):
            rows["prefixes"] = (prefixes[start:end], tf.string)
        if name in ("sample", "controlled_sample"):
            count = len(batch) * samples
            repeat = [line for line in range(start, end) for _ in range(samples)]
            batch = [lines[line] for line in repeat]
            rows = {key: ([values[i - start] for i in repeat], dtype)
                    for key, (values, dtype) in rows.items()}  # fmt: skip
            if name == "controlled_sample":
                rows["prefixes"] = ([prefixes[line] for line in repeat], tf.string)
            seed = 0 if args.seed is None else args.seed
            seeds = [
                int(np.random.SeedSequence([seed, line, k]).generate_state(1, np.uint64)[0] >> 1)
                for line in range(start, end)
                for k in range(samples)
            ]  # one stream per line number and sample: independent of batches and resumes
            rows.update({
                "temperature": ([args.sampling_temperature or 1.0] * count, tf.float32),
                "top_k": ([args.sampling_topk or 0] * count, tf.int32),
                "top_p": ([args.sampling_topp or 1.0] * count, tf.float32),
                "seed": (seeds, tf.int64),
            })  # fmt: skip
        outputs = client.call_in_batches(signature, batch, args.batch_size, rows, scalars)
        texts = [text.decode("utf-8") for text in outputs["translations"]]
        aligned = None
        if name == "align":
            aligned = [
                client.word_alignments(
                    [piece.decode("utf-8") for piece in source],
                    [piece.decode("utf-8") for piece in target],
                    positions.tolist(),
                )
                for source, target, positions in zip(
                    outputs["source_pieces"], outputs["target_pieces"], outputs["alignments"],
                    strict=True,
                )
            ]  # fmt: skip
        yield end, texts, aligned


def main(argv=None, prog="kt translate"):
    parser = command_parser(prog, __doc__)
    parser.add_argument("--model", required=True, help="saved_models/NAME or NAME/VERSION")
    parser.add_argument("--input", help="a text file; defaults to stdin")
    parser.add_argument("--output", help="defaults to stdout")
    parser.add_argument(
        "--beam-size", type=int, help="1 for greedy search; defaults to the export's"
    )
    parser.add_argument("--alpha", type=float, help="length penalty; defaults to the export's")
    parser.add_argument(
        "--penalty-form",
        choices=["gnmt", "power"],
        help="the length penalty's form: gnmt, ((5 + |Y|) / 6) ** alpha, or power, "
        "|Y| ** alpha (transformers'); defaults to the export's",
    )
    parser.add_argument(
        "--batch-size", type=int, default=1024, help="sentences per call of the SavedModel"
    )
    parser.add_argument("--prefix-file", help="one target prefix per input line ('' for none)")
    parser.add_argument("--alignments", help="write word alignments (i-j pairs) to this file")
    parser.add_argument("--sampling-topk", type=int, help="sample among the k best (0: all)")
    parser.add_argument("--sampling-topp", type=float, help="sample within this nucleus mass")
    parser.add_argument("--sampling-temperature", type=float, help="divides log-probabilities")
    parser.add_argument("--num-samples", type=int, help="samples per input line (lines out)")
    parser.add_argument("--seed", type=int, help="sampling seed (default 0)")
    controls = parser.add_argument_group(
        "decoding controls (with any search, prefixes or sampling: the `controlled*` signatures)"
    )
    controls.add_argument("--no-repeat-ngram-size", type=int, help="no n-gram of this size twice")
    controls.add_argument(
        "--repetition-penalty", type=float, help="penalize tokens already produced (> 1)"
    )
    controls.add_argument("--min-length", type=int, help="the fewest pieces before the end")
    controls.add_argument(
        "--max-output-length",
        "--max-length",  # its name before 0.3; training's max_length is another setting
        dest="max_length",
        type=int,
        help="the most pieces of a translation, the end included (--max-length: the same)",
    )
    controls.add_argument(
        "--disable-unk", action="store_const", const=True, help="never produce <unk>"
    )
    controls.add_argument("--banned-words", help="a file of words and phrases never to produce")
    return run(_translate, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
