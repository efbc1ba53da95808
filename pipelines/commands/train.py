"""Trains a Transformer (`kt-train`).

With no arguments it trains the `default` recipe on the embedded CLDR corpus.
Examples:
    python -m pipelines.train
    python -m pipelines.train --recipe multi30k --multi30k-dir data/multi30k
    python -m pipelines.train --recipe base --corpus files \
        --train-files train.en train.de --validation-files dev.en dev.de
    python -m pipelines.train --config my_run.json --set model.dropout=0.2
    python -m pipelines.train --max-minutes 30 --cooldown 0.3
    python -m pipelines.train --subword-sampling 0.1 --set subword_copies=8

Outputs under `--output-dir`: config.json, sentencepiece.model, checkpoints/
(one `.keras` per epoch), backup/ (BackupAndRestore: rerunning the same
command after a crash resumes), logs/ (TensorBoard), model.keras, result.json.
Under MultiWorkerMirroredStrategy (TF_CONFIG with several workers) worker 0
writes there and every other worker under `workers/worker-N/`.
"""

import argparse
import json
import logging
import sys

from pipelines.commands import run
from pipelines.errors import ConfigError
from pipelines.training.config import load_config


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipelines.train",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 2)[2],
    )
    parser.add_argument("--recipe", default="default", help="default, multi30k, base or big")
    parser.add_argument("--config", help="JSON file of settings, applied over the recipe")
    parser.add_argument("--corpus", help="default, multi30k, files or tfds")
    parser.add_argument("--multi30k-dir", help="folder with Multi30k's train/val/test .gz files")
    parser.add_argument("--train-files", nargs=2, metavar=("SOURCE", "TARGET"))
    parser.add_argument("--validation-files", nargs=2, metavar=("SOURCE", "TARGET"))
    parser.add_argument("--tfds", dest="tfds_name", help="e.g. wmt14_translate/de-en")
    parser.add_argument("--tfds-data-dir")
    parser.add_argument("--source-language")
    parser.add_argument("--target-language")
    parser.add_argument("--target-locale", help="CLDR locale of the default corpus targets")
    parser.add_argument("--preset", help="transformer_small, transformer_base or transformer_big")
    parser.add_argument("--vocabulary-size", type=int)
    parser.add_argument("--batch-tokens", type=int, help="tokens per side of a batch")
    parser.add_argument("--max-length", type=int)
    parser.add_argument(
        "--subword-sampling",
        type=float,
        help="BPE-dropout on the training pairs: probability of skipping a merge",
    )
    parser.add_argument("--steps", type=int, help="total optimizer steps")
    parser.add_argument("--steps-per-epoch", type=int)
    parser.add_argument("--warmup-steps", type=int)
    parser.add_argument("--accumulation-steps", type=int, help="micro-batches per step")
    parser.add_argument("--mixed-precision", choices=("mixed_bfloat16", "mixed_float16"))
    parser.add_argument("--xla", action="store_true", default=None)
    parser.add_argument("--output-dir")
    parser.add_argument("--backup-every", type=int, help="steps between backups")
    parser.add_argument("--early-stopping-patience", type=int)
    parser.add_argument("--average-last", type=int, help="average the last N epoch checkpoints")
    parser.add_argument(
        "--max-minutes",
        type=float,
        help="a wall-clock budget: the run is planned to end inside it (--steps is then a cap)",
    )
    parser.add_argument(
        "--cooldown", type=float, help="fraction of the run over which the rate falls to 0"
    )
    parser.add_argument("--seed", type=int)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any setting, JSON value; model.NAME sets a model argument",
    )
    return parser, parser.parse_args(argv)


def _overrides(args):
    """`(flags, settings)` for `load_config`: flags given, and the `--set` values."""
    skip = {"recipe", "config", "set"}
    flags = {k: v for k, v in vars(args).items() if k not in skip}
    settings, model = {}, {}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE. Received: {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if key.startswith("model."):
            model[key[len("model.") :]] = value
        else:
            settings[key] = value
    if model:
        settings["model"] = model
    return flags, settings


def _train(args):
    config = load_config(args.recipe, args.config, *_overrides(args))
    from pipelines.training.run import run_training  # imports TensorFlow: after validation

    print(json.dumps(run_training(config), indent=2))


def main(argv=None):
    _, args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return run(_train, args)


if __name__ == "__main__":
    sys.exit(main())
