"""Flags several commands share, and the parser every command uses."""

import argparse
import os
import sys

from pipelines.errors import ConfigError, DataError


class CommandParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose errors are one `error:` line and exit status 2."""

    def error(self, message):
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)


def command_parser(prog, doc):
    """A `CommandParser` titled by the first line of a command module's docstring."""
    return CommandParser(
        prog=prog,
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_run_arguments(parser, source_length=False):
    """Adds `--run-dir`, `--model`, `--sentencepiece` (and `--max-source-length`) to a parser."""
    parser.add_argument("--run-dir", help="a training output folder (model.keras, ...)")
    parser.add_argument("--model", help="a .keras file; defaults to RUN_DIR/model.keras")
    parser.add_argument("--sentencepiece", help="defaults to RUN_DIR/sentencepiece.model")
    if source_length:
        parser.add_argument(
            "--max-source-length", type=int, help="defaults to the run's max_length"
        )


def run_files(args):
    """`(model_path, sentencepiece_path)` from `add_run_arguments` flags.

    Raises:
        ConfigError: naming the file that does not exist.
        DataError: the SentencePiece file is not a SentencePiece model.
    """
    run_dir = args.run_dir or ""
    model_path = args.model or os.path.join(run_dir, "model.keras")
    spm_path = args.sentencepiece or os.path.join(run_dir, "sentencepiece.model")
    for label, path in (("model", model_path), ("SentencePiece model", spm_path)):
        if not os.path.isfile(path):
            raise ConfigError(
                f"{label} not found: {path} (give --run-dir or --model/--sentencepiece)"
            )
    import sentencepiece

    try:  # milliseconds: the file is read before any model is
        sentencepiece.SentencePieceProcessor(model_file=spm_path)
    except (RuntimeError, OSError) as error:
        raise DataError(f"{spm_path} is not a SentencePiece model ({error})") from None
    return model_path, spm_path


def max_source_length(args):
    """`--max-source-length`, else the run's `max_length` from RUN_DIR/config.json.

    Raises:
        ConfigError: when neither gives a length of at least 2.
    """
    from pipelines.training.recorded import run_max_length  # imports Keras

    length = args.max_source_length
    if length is None:
        run_dir = args.run_dir or os.path.dirname(os.path.abspath(args.model or "model.keras"))
        length = run_max_length(run_dir)
        if length is None:
            raise ConfigError(
                f"--max-source-length: {run_dir} holds no run's config.json to read it from; "
                "give the longest source to keep, in pieces with the end id (as "
                "encode_sources(max_length=N) cut them in training): --max-source-length N"
            )
    if length < 2:
        raise ConfigError(f"--max-source-length must be at least 2. Received: {length}")
    return length
