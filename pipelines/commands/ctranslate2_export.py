"""Converts a trained run to a CTranslate2 model folder.

    kt ct2-export --run-dir runs/multi30k --output ct2/multi30k

CTranslate2 is an optional extra (`pip install "keras-aiayn[tensorflow,ctranslate2]"`);
see `pipelines.serving.ctranslate2` for what the folder holds.
"""

import os
import sys

from pipelines.commands import run
from pipelines.commands.arguments import (
    add_run_arguments,
    command_parser,
    max_source_length,
    run_files,
)
from pipelines.errors import ConfigError, ExportError, UsageError
from pipelines.files import prepare_output_folder


def _parse(argv, prog):
    parser = command_parser(prog, __doc__.splitlines()[0])
    add_run_arguments(parser, source_length=True)
    parser.add_argument("--output", required=True, help="the CTranslate2 folder to write")
    parser.add_argument("--quantization", help="e.g. int8, int8_float32, float16")
    parser.add_argument("--force", action="store_true", help="replace an existing --output")
    return parser.parse_args(argv)


def _convert(args):
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UsageError(
            'CTranslate2 is not installed: pip install "keras-aiayn[tensorflow,ctranslate2]"'
        ) from None
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    from pipelines.serving.ctranslate2 import convert
    from pipelines.training.checkpoints import load_checkpoint

    if args.quantization is not None and args.quantization not in ACCEPTED_MODEL_TYPES:
        raise ConfigError(
            f"--quantization must be one of {', '.join(ACCEPTED_MODEL_TYPES)}. "
            f"Received: {args.quantization}"
        )

    model_path, spm_path = run_files(args)
    max_length = max_source_length(args)
    if os.path.exists(args.output) and not args.force:
        raise ExportError(f"--output: {args.output} exists; pass --force to replace it")
    prepare_output_folder(os.path.dirname(os.path.abspath(args.output)), "--output")
    model = load_checkpoint(model_path)
    from pipelines.training.recorded import run_decoding

    decoding = run_decoding(args.run_dir or os.path.dirname(os.path.abspath(model_path)))
    print(
        convert(
            model, spm_path, args.output, max_length, args.quantization, force=args.force,
            extra_length=decoding["extra_length"], search=decoding,
        )
    )  # fmt: skip


def main(argv=None, prog="kt ct2-export"):
    return run(_convert, _parse(argv, prog))


if __name__ == "__main__":
    sys.exit(main())
