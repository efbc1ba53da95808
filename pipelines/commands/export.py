"""Exports a trained run as a SavedModel for TF Serving.

    kt export --run-dir runs/default --name default

writes `saved_models/default/1/` (TF Serving's `NAME/VERSION` layout); see
`pipelines.serving.saved_model` for its signatures. The search (`--beam-size`,
`--alpha`, `--penalty-form`, `--extra-length`, `--max-output-length`, `--end-at-limit`,
`--tree-constraint`) defaults to the run's `decoding` settings in RUN_DIR/config.json
(beam 4, alpha 0.6 with GNMT's penalty, +50 where it has none; an imported
model's run records its own generation settings), `--tree-words` to its
`data.treebank_words`, and the version records what it was exported with in
`assets.extra/keras_transformer.json`. `--quantize int8` (or `int8-weights`)
stores the matrix weights in int8 (`pipelines.serving.quantization`);
`--batching` writes warm-up requests that TF Serving's `--enable_batching`
accepts (`pipelines.serving.warmup`); `--signatures` exports some signatures only.
"""

import argparse
import os
import sys

from keras_transformer.decoding.steps import PENALTY_FORMS
from pipelines.commands import run
from pipelines.commands.arguments import (
    add_run_arguments,
    command_parser,
    max_source_length,
    run_files,
)
from pipelines.errors import ConfigError
from pipelines.files import prepare_output_folder
from pipelines.serving.quantization import QUANTIZE_MODES
from pipelines.serving.signatures import SIGNATURES
from pipelines.serving.translation import CHUNK_SIZE, LENGTH_DEFAULTS
from pipelines.serving.versions import check_version


def _parse(argv, prog):
    parser = command_parser(prog, __doc__.splitlines()[0])
    add_run_arguments(parser, source_length=True)
    parser.add_argument("--name", default="translator", help="model name (folder under --base)")
    parser.add_argument("--base", default="saved_models", help="where model folders live")
    parser.add_argument("--version", type=int, help="defaults to the next free integer")
    parser.add_argument("--beam-size", type=int, help="defaults to the run's (decoding group)")
    parser.add_argument("--alpha", type=float, help="defaults to the run's")
    parser.add_argument(
        "--extra-length",
        type=int,
        help="target pieces beyond a sentence's source pieces; defaults to the run's",
    )
    parser.add_argument(
        "--penalty-form",
        choices=sorted(PENALTY_FORMS),
        help="length penalty: gnmt ((5 + |Y|) / 6) ** alpha, or power |Y| ** alpha "
        "(transformers'); defaults to the run's",
    )
    parser.add_argument(
        "--max-output-length",
        type=int,
        help="the most target pieces of any sentence, the end included, whatever its source "
        "(0: none); defaults to the run's",
    )
    parser.add_argument(
        "--end-at-limit",
        action=argparse.BooleanOptionalAction,
        help="a sentence's last allowed piece is the end (transformers' forced_eos_token_id); "
        "defaults to the run's",
    )
    parser.add_argument(
        "--tree-constraint",
        action=argparse.BooleanOptionalAction,
        help="parsers: searches write only well-formed trees over the input's words; "
        "defaults to the run's",
    )
    parser.add_argument(
        "--tree-words",
        action=argparse.BooleanOptionalAction,
        help="parsers: the model writes each word before its tag (data.treebank_words); "
        "defaults to the run's",
    )
    parser.add_argument(
        "--nbest", type=int, help="hypotheses returned by `nbest` (default: up to 4)"
    )
    parser.add_argument(
        "--quantize",
        choices=QUANTIZE_MODES,
        help="store the matrix weights in int8: int8 also runs the products on int8 inputs, "
        "int8-weights in float32 (default: float32 weights)",
    )
    parser.add_argument(
        "--batching",
        action="store_true",
        help="for TF Serving's --enable_batching: warm-up requests without `translate` and "
        "`controlled_search`, whose scalar inputs the batcher refuses (a refused warm-up "
        "request fails the load)",
    )
    parser.add_argument(
        "--signatures",
        nargs="+",
        choices=SIGNATURES,
        metavar="NAME",
        help=f"export these signatures only: {', '.join(SIGNATURES)} (default: all); "
        "fewer load faster and take less space",
    )
    parser.add_argument(
        "--chunk-size",
        type=int,
        default=CHUNK_SIZE,
        help="the most sentences of a request searched at once (bounds memory)",
    )
    return parser.parse_args(argv)


def _export(args):
    import keras

    if keras.backend.backend() != "tensorflow":
        raise ConfigError(
            "kt export writes a TensorFlow graph and needs KERAS_BACKEND=tensorflow, not "
            f"{keras.backend.backend()}"
        )
    model_path, spm_path = run_files(args)
    max_length = max_source_length(args)
    from pipelines.training.recorded import run_decoding, run_tree_words

    run_dir = args.run_dir or os.path.dirname(os.path.abspath(model_path))
    recorded = run_decoding(run_dir)
    for name, value in recorded.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.extra_length < 1:
        raise ConfigError(f"--extra-length must be positive. Received: {args.extra_length}")
    if args.beam_size < 1:
        raise ConfigError(f"--beam-size must be positive. Received: {args.beam_size}")
    if args.max_output_length < 0:
        raise ConfigError(
            f"--max-output-length must be 0 (none) or positive. Received: {args.max_output_length}"
        )
    if not args.alpha >= 0:
        raise ConfigError(f"--alpha must be 0 or positive. Received: {args.alpha}")
    if args.nbest is None:
        args.nbest = min(4, args.beam_size)
    if not 1 <= args.nbest <= args.beam_size:
        raise ConfigError(f"--nbest must be between 1 and --beam-size ({args.beam_size})")
    if args.chunk_size < 1:
        raise ConfigError(f"--chunk-size must be positive. Received: {args.chunk_size}")
    base_dir = os.path.join(args.base, args.name)
    check_version(base_dir, args.version)
    prepare_output_folder(base_dir, "--base/--name")
    from pipelines.serving.saved_model import Translator, export
    from pipelines.training.checkpoints import load_checkpoint

    translator = Translator(
        load_checkpoint(model_path),
        spm_path,
        max_length,
        args.beam_size,
        args.alpha,
        args.nbest,
        args.chunk_size,
        args.extra_length,
        args.tree_constraint,
        tree_words=run_tree_words(run_dir) if args.tree_words is None else args.tree_words,
        quantize=args.quantize,
        lengths={name: getattr(args, name) for name in LENGTH_DEFAULTS},
        signatures=args.signatures,
    )
    print(export(translator, base_dir, args.version, batching=args.batching))


def main(argv=None, prog="kt export"):
    return run(_export, _parse(argv, prog))


if __name__ == "__main__":
    sys.exit(main())
