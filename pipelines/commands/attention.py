"""PNG heat map of the encoder-decoder attention for one sentence.

    kt attention --run-dir runs/default \\
        --source "Monday, March 3, 2014" --output attention.png

Rows are target subwords, columns source subwords. Without `--target` the
model's own greedy translation is shown. `--layer` and `--head` pick one panel;
`--head mean` averages heads; the default draws every layer (rows of panels)
and head (columns).
"""

import os
import sys

from pipelines.commands import run
from pipelines.commands.arguments import add_run_arguments, command_parser, run_files
from pipelines.errors import ConfigError
from pipelines.files import atomic_output, prepare_output_file


def _draw(args):
    import numpy as np
    import sentencepiece as spm

    from pipelines import visualization
    from pipelines.data.vocabularies import target_vocabulary_path
    from pipelines.training.checkpoints import load_checkpoint

    model_path, spm_path = run_files(args)
    prepare_output_file(args.output, "--output")
    suffix = os.path.splitext(args.output)[1]
    formats = visualization.image_formats()
    if suffix[1:].lower() not in formats:
        raise ConfigError(
            f"--output {args.output}: not an image file matplotlib writes (its extension "
            f"must be one of {', '.join(sorted(formats))})"
        )
    model = load_checkpoint(model_path)
    # --layer and --head against the model's shape before the decoding they select from.
    visualization.select(np.zeros((model.num_layers, model.num_heads, 1, 1)), args.layer, args.head)
    processor = spm.SentencePieceProcessor(model_file=spm_path)
    target_processor = spm.SentencePieceProcessor(model_file=target_vocabulary_path(spm_path))
    attention, source_pieces, target_pieces = visualization.attention_maps(
        model, processor, args.source, args.target, target_processor
    )
    panels, titles = visualization.select(attention, args.layer, args.head)
    with atomic_output(args.output, suffix) as staging:
        width, height = visualization.plot(panels, titles, source_pieces, target_pieces, staging)
    print(f"{args.output}: {width}x{height} pixels, target: {''.join(target_pieces[:-1])}")


def main(argv=None, prog="kt attention"):
    parser = command_parser(prog, __doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", help="defaults to the model's greedy translation")
    parser.add_argument("--layer", default="all", help="'all' or a layer index")
    parser.add_argument("--head", default="all", help="'all', 'mean' or a head index")
    parser.add_argument("--output", default="attention.png")
    return run(_draw, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
