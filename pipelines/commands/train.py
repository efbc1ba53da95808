"""Trains a Transformer from a recipe, a config file and settings.

With no arguments it trains the `default` recipe on the embedded CLDR corpus.
Examples:
    kt train
    kt train --recipe multi30k --multi30k-dir data/multi30k
    kt train --recipe base --corpus files \\
        --train-files train.en train.de --validation-files dev.en dev.de
    kt train --config my_run.json --set model.dropout=0.2
    kt train --max-minutes 30 --cooldown 0.3
    kt train --validation-sentences 500 --metric bleu --select best
    kt train --recipe multi30k --multi30k-dir data/multi30k --print-config
    kt train --init-from runs/default --corpus files \\
        --train-files domain.en domain.de --output-dir runs/domain

Every setting is a flag (`--batch-tokens 2048`) and can be set with
`--set NAME=VALUE` or `--set GROUP.NAME=VALUE` (a JSON value). Outputs under
`--output-dir`: config.json, sentencepiece.model (and sentencepiece.tags, a
parser's tags, with `whole_source_words`), checkpoints/ (weights-only
`.keras` files, one per epoch or every `checkpoint_minutes`, and best.keras),
backup/ (the last step's whole state: rerunning the same command after a
crash resumes there), logs/ (TensorBoard), model.keras, result.json. Under
MultiWorkerMirroredStrategy (TF_CONFIG with several workers) worker 0
writes there and every other worker under `workers/worker-N/`.

A rerun into a run's folder resumes it from its last backup (a finished run
too, given more `--steps`), and may change only its length, what it checks
and keeps, its end-of-run outputs, and how an update is batched
(`pipelines/training/identity.py`); other settings are refused. One
`kt train` writes a run folder at a time (`run.lock`). `--init-from` starts
a new run from a trained one: its architecture, vocabulary file and
weights, with the `finetune` recipe's schedule unless `--recipe` says
otherwise.
"""

import argparse
import json
import logging
import sys

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.errors import ConfigError
from pipelines.files import prepare_output_folder
from pipelines.training.config import SETTINGS, base_type, validate
from pipelines.training.identity import check_rerun
from pipelines.training.init_from import apply_source, given_settings
from pipelines.training.loading import check_paths, load_config, recipe_names


def _add_setting_flags(parser):
    """One flag per declared setting, in one argument group per concern."""
    groups = {}
    for item in SETTINGS.values():  # in declaration order, group by group
        if item.group not in groups:
            groups[item.group] = parser.add_argument_group(f"{item.group} settings")
        group = groups[item.group]
        flag = "--" + item.name.replace("_", "-")
        base, _, _ = base_type(item.type)
        options = {"dest": item.name, "default": argparse.SUPPRESS}
        help = f"{item.help} (default: {json.dumps(item.default)})"
        if base is bool:
            group.add_argument(flag, action=argparse.BooleanOptionalAction, help=help, **options)
            continue
        if base is list:
            options["nargs"] = item.limits.get("nargs", "+")
        if "choices" in item.limits:
            options["metavar"] = "{" + ",".join(map(str, item.limits["choices"])) + "}"
        else:
            options["metavar"] = item.name.upper() if base is not list else "VALUE"
        group.add_argument(flag, help=help, **options)


def parse_args(argv, prog="kt train"):
    parser = command_parser(prog, __doc__)
    parser.add_argument(
        "--recipe",
        help=f"one of {recipe_names()} (default: finetune with --init-from, else default)",
    )
    parser.add_argument("--config", help="JSON file of settings (nested by group), over the recipe")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any setting, a JSON value; GROUP.NAME also works (model.dropout=0.2)",
    )
    parser.add_argument(
        "--print-config", action="store_true", help="print the resolved settings and exit"
    )
    parser.add_argument(
        "--restart-data-order",
        action="store_true",
        help="resume with other batch_tokens x accumulation_steps: the data order starts anew "
        "at the restored step",
    )
    _add_setting_flags(parser)
    return parser.parse_args(argv)


def _settings(args):
    """`{name: value}` from the setting flags given, then the `--set` items."""
    skip = {"recipe", "config", "set", "print_config", "restart_data_order"}
    values = {k: v for k, v in vars(args).items() if k not in skip}
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects NAME=VALUE. Received: {item!r}")
        try:
            values[key] = json.loads(raw)
        except json.JSONDecodeError:
            values[key] = raw
    return values


def resolved_config(args):
    """The run's `TrainConfig` from parsed arguments: recipe, config file, flags, source model.

    Without `--recipe`, a run given `init_from` (as a flag, `--set` or in
    `--config`) takes the `finetune` recipe, any other the `default` one.
    """
    settings = _settings(args)
    given = given_settings(args.config, settings)
    recipe = args.recipe or ("finetune" if "init_from" in given else "default")
    config = load_config(recipe, args.config, settings)
    if config.model.init_from:
        apply_source(config, given)
        validate(config)  # the source's architecture with the run's other settings
    return config


def _train(args):
    config = resolved_config(args)
    if args.print_config:
        print(config.to_json())
        return 0
    check_paths(config)
    check_rerun(config, args.restart_data_order)
    prepare_output_folder(config.output.output_dir, "output_dir")
    from pipelines.training.run import run_training  # the data and the work: after the checks

    print(json.dumps(run_training(config), indent=2))


def main(argv=None, prog="kt train"):
    args = parse_args(argv, prog)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return run(_train, args)


if __name__ == "__main__":
    sys.exit(main())
