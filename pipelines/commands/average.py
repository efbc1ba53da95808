"""Averages checkpoints (section 6.1: the last 5 or 20 checkpoints).

    kt average runs/multi30k/checkpoints/*.keras --output averaged.keras

The averaged model is written beside `--output` and renamed into place: a
killed run leaves the previous file there, or none, never a broken one.
"""

import contextlib
import os
import sys

from pipelines.commands import run
from pipelines.commands.arguments import command_parser
from pipelines.errors import ConfigError
from pipelines.files import check_input_file, prepare_output_file, run_folder_lock


def _average(args):
    if not args.output.endswith(".keras"):
        raise ConfigError(f"--output must be a .keras file. Received: {args.output}")
    for path in args.checkpoints:
        check_input_file(path, "checkpoint")
    prepare_output_file(args.output, "--output")
    from pipelines.training.checkpoints import average_checkpoints  # imports Keras

    # Into a run folder (its config.json): not while a `kt train` writes it.
    folder = os.path.dirname(os.path.abspath(args.output))
    is_run = os.path.isfile(os.path.join(folder, "config.json"))
    with run_folder_lock(folder, "--output") if is_run else contextlib.nullcontext():
        average_checkpoints(args.checkpoints, args.output)
    print(f"Averaged {len(args.checkpoints)} checkpoints into {args.output}")


def main(argv=None, prog="kt average"):
    parser = command_parser(prog, __doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", help=".keras checkpoints of one run")
    parser.add_argument("--output", required=True, help="the averaged .keras model to write")
    return run(_average, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
