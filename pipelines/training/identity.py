"""A run folder's settings are its identity: a rerun into it must keep them.

A rerun of `kt train` into a folder that holds a run (its `config.json`)
resumes that run, and may change only what a resumed run can honour: how
long it trains, what it checks and keeps on the way, and what it writes at
the end (`RESUMABLE`). The batching of an update (`STREAM`) may change too,
the data order then starting anew where the run stands: freely where the
tokens of an update stay the same (`batch_tokens` times
`accumulation_steps`, after an out-of-memory error or a move to other
hardware), else only when asked (`--restart-data-order`). Any other
difference, an architecture or the data, would train a different model
over the first one's outputs, so it is refused before any work.
"""

import dataclasses
import json
import os

from pipelines.errors import ConfigError
from pipelines.files import read_json
from pipelines.training.config import SETTINGS, DecodingConfig

# The settings a rerun may change: the run's length, and its end-of-run outputs (the whole
# `decoding` group: the search of the end-of-run evaluation and of the export).
RESUMABLE = (
    "output_dir",
    "steps",
    "max_minutes",
    "reserve_minutes",
    "backup_every",
    "keep_checkpoints",
    "validation_sentences",
    "validation_beam",
    "min_improvement",
    "early_stopping_patience",
    "select",
    "average_last",
    "average_share",
    "heldout_split",
    *(field.name for field in dataclasses.fields(DecodingConfig)),
)
# The settings of the training stream: a change restarts the data order (see above).
# The input streams and the data service change the order, never an update's tokens.
STREAM = ("batch_tokens", "accumulation_steps", "input_streams", "data_service")
# Settings an earlier version did not record, set from the run's files rather than given:
# a recorded run without them is compared on the rest (its data checks them).
INFERRED = ("target_vocabulary",)
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
        if item.name in RESUMABLE or item.name in STREAM:
            continue
        if item.name in INFERRED and item.name not in recorded.get(item.group, {}):
            continue
        old = recorded.get(item.group, {}).get(item.name, item.default)
        new = getattr(getattr(config, item.group), item.name)
        if _comparable(item.name, old) != _comparable(item.name, new):
            differing.append((f"{item.group}.{item.name}", old, new))
    return differing


def stream_settings(config):
    """`{name: value}` of the `STREAM` settings: what the saved data position depends on.

    `input_streams` is listed where it is not 1 and `data_service` where it
    is set, so that a backup written before they existed compares equal.
    """
    settings = {
        "batch_tokens": config.batching.batch_tokens,
        "accumulation_steps": config.optimization.accumulation_steps,
    }
    if (config.batching.input_streams or 1) != 1:
        settings["input_streams"] = config.batching.input_streams
    if config.batching.data_service:
        settings["data_service"] = config.batching.data_service
    return settings


def check_rerun(config, restart_data_order=False):
    """Refuses a run into a folder that holds a run of other settings.

    Args:
        config: the new run's `TrainConfig`.
        restart_data_order: bool, the rerun may change the tokens of an
            update (`STREAM`), its data order starting anew.

    Raises:
        ConfigError: one line naming each differing setting with both
            values, pointing at `--init-from` and a new `--output-dir`.
    """
    folder = config.output.output_dir
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return
    recorded = read_json(path)
    differing = differing_settings(recorded, config)
    if differing:
        changes = ", ".join(
            f"{name} {json.dumps(old)} -> {json.dumps(new)}" for name, old, new in differing
        )
        raise ConfigError(
            f"output_dir {folder} holds a run with other settings ({changes}); a rerun may "
            f"change only {', '.join(RESUMABLE[1:] + STREAM)}. Train into a new --output-dir, "
            f"or start a new run from this one with --init-from {folder}"
        )
    old = {
        name: recorded.get(SETTINGS[name].group, {}).get(name, SETTINGS[name].default)
        for name in STREAM
    }
    new = stream_settings(config)
    tokens = old["batch_tokens"] * old["accumulation_steps"]
    if tokens != new["batch_tokens"] * new["accumulation_steps"] and not restart_data_order:
        raise ConfigError(
            f"output_dir {folder}: batch_tokens x accumulation_steps "
            f"{old['batch_tokens']} x {old['accumulation_steps']} -> "
            f"{new['batch_tokens']} x {new['accumulation_steps']} changes the tokens of an "
            f"update; keep their product at {tokens}, or pass --restart-data-order to go on "
            "with larger or smaller updates"
        )
