"""A run folder's settings are its identity: a rerun into it must keep them.

A rerun of `kt train` into a folder that holds a run (its `config.json`)
resumes that run, and may change only what a resumed run can honour: how
long it trains and what it writes at the end (`RESUMABLE`). Any other
difference, an architecture or the data, would train a different model
over the first one's outputs, so it is refused before any work.
"""

import json
import os

from pipelines.errors import ConfigError
from pipelines.files import read_json
from pipelines.training.config import SETTINGS

# The settings a rerun may change: the run's length, and its end-of-run outputs.
RESUMABLE = (
    "output_dir",
    "steps",
    "max_minutes",
    "reserve_minutes",
    "backup_every",
    "early_stopping_patience",
    "average_last",
    "average_share",
    "heldout_split",
    "beam_size",
    "alpha",
    "extra_length",
    "tree_constraint",
)
# Settings that name files or folders: compared as absolute paths.
PATHS = (
    "multi30k_dir",
    "treebank_dir",
    "train_files",
    "validation_files",
    "tfds_data_dir",
    "init_from",
)


def _comparable(name, value):
    if value is None or name not in PATHS:
        return value
    if isinstance(value, list):
        return [os.path.abspath(path) for path in value]
    return os.path.abspath(value)


def differing_settings(recorded, config):
    """The settings of `config` that differ from a recorded run's, beyond `RESUMABLE`.

    Args:
        recorded: dict, a run's `config.json` (nested by group). A setting
            it does not hold (a run older than the setting) counts as the
            setting's default.
        config: the new run's `TrainConfig`.

    Returns:
        list of `(group.name, recorded value, new value)`, in declaration order.
    """
    differing = []
    for item in SETTINGS.values():
        if item.name in RESUMABLE:
            continue
        old = recorded.get(item.group, {}).get(item.name, item.default)
        new = getattr(getattr(config, item.group), item.name)
        if _comparable(item.name, old) != _comparable(item.name, new):
            differing.append((f"{item.group}.{item.name}", old, new))
    return differing


def check_rerun(config):
    """Refuses a run into a folder that holds a run of other settings.

    Args:
        config: the new run's `TrainConfig`.

    Raises:
        ConfigError: one line naming each differing setting with both
            values, pointing at `--init-from` and a new `--output-dir`.
    """
    folder = config.output.output_dir
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return
    differing = differing_settings(read_json(path), config)
    if differing:
        changes = ", ".join(
            f"{name} {json.dumps(old)} -> {json.dumps(new)}" for name, old, new in differing
        )
        raise ConfigError(
            f"output_dir {folder} holds a run with other settings ({changes}); a rerun may "
            f"change only {', '.join(RESUMABLE[1:])}. Train into a new --output-dir, "
            f"or start a new run from this one with --init-from {folder}"
        )
