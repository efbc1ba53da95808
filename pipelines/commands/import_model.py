"""Imports a model trained elsewhere (Marian / OPUS-MT) as a run folder.

    kt import marian Helsinki-NLP/opus-mt-en-de --output-dir runs/opus-mt-en-de
    kt import marian path/to/opus-mt-en-de --output-dir runs/opus-mt-en-de

SOURCE is a folder in the Hugging Face layout (config.json, model.safetensors
or pytorch_model.bin, source.spm, target.spm, vocab.json) or a Hub name,
downloaded into the Hugging Face cache (`--cache-dir`, else `HF_HOME`'s). The
run folder holds model.keras, sentencepiece.model (source side),
sentencepiece.target.model, config.json and import.json; `kt export`,
`kt translate`, `kt score`, `kt ct2-export`, `kt attention` and
`kt train --init-from` take it like a trained run's. See
docs/start-from-a-model.md for what is mapped and how.
"""

import json
import os
import sys
from contextlib import nullcontext

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.files import run_folder_lock

FORMATS = ("marian",)


def _import(args):
    from pipelines.imports.marian import import_marian  # imports Keras

    # A folder a `kt train` writes is refused, naming its process.
    folder = args.output_dir
    with run_folder_lock(folder, "--output-dir") if os.path.isdir(folder) else nullcontext():
        result = import_marian(args.source, folder, args.force, args.cache_dir)
    print(json.dumps(result, indent=2))


def main(argv=None, prog="kt import"):
    parser = command_parser(prog, __doc__)
    parser.add_argument("format", choices=FORMATS, help="the model's format")
    parser.add_argument("source", help="a model folder, or a Hugging Face Hub name")
    parser.add_argument("--output-dir", required=True, help="the run folder to write")
    parser.add_argument("--cache-dir", help="the Hugging Face cache for a download")
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    return run(_import, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
