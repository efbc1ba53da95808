"""Averages checkpoints (section 6.1: the last 5 or 20 checkpoints).

    kt average --run-dir runs/base --last 5 --output averaged.keras
    kt average runs/multi30k/checkpoints/epoch-025.keras runs/multi30k/checkpoints/epoch-026.keras \
        --output averaged.keras

`--run-dir` with `--last N` averages the run's newest N checkpoints (`epoch-N.keras` or
`step-N.keras`, never `best.keras`), as `average_last` does at the end of a run.

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


def _chosen(args):
    """The checkpoints named, or a run's newest `--last`."""
    if bool(args.checkpoints) == bool(args.run_dir):
        raise ConfigError("give checkpoint files, or --run-dir with --last N: one of the two")
    if not args.run_dir:
        if args.last:
            raise ConfigError("--last counts a run's checkpoints: give --run-dir, not files")
        return args.checkpoints
    if not args.last or args.last < 1:
        raise ConfigError(f"--run-dir needs --last N, N at least 1. Received: --last {args.last}")
    from pipelines.training.checkpoints import epoch_checkpoints

    found = epoch_checkpoints(os.path.join(args.run_dir, "checkpoints"))
    if not found:
        raise ConfigError(f"--run-dir: {args.run_dir}/checkpoints holds no epoch- or step- file")
    if len(found) < args.last:
        print(f"warning: --last {args.last}: {args.run_dir} has {len(found)} checkpoints")
    return found[-args.last :]


def _average(args):
    if not args.output.endswith(".keras"):
        raise ConfigError(f"--output must be a .keras file. Received: {args.output}")
    args.checkpoints = _chosen(args)
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
    parser.add_argument("checkpoints", nargs="*", help=".keras checkpoints of one run")
    parser.add_argument("--run-dir", help="a training output folder, with --last")
    parser.add_argument("--last", type=int, help="the run's newest N checkpoints")
    parser.add_argument("--output", required=True, help="the averaged .keras model to write")
    return run(_average, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
