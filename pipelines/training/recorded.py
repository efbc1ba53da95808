"""What a finished training run recorded in RUN_DIR/config.json, for the commands that follow it.

`kt export` and `kt translate` read a run's source length and search settings
from here, so the flags repeat nothing the recipe already said.
"""

import dataclasses
import json
import os

from pipelines.errors import ConfigError
from pipelines.training.config import SETTINGS, DecodingConfig, check_limits, coerce


def _run_config(run_dir):
    """RUN_DIR/config.json as a dict, or None where there is none."""
    path = os.path.join(run_dir or "", "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            recorded = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"{path}: not a run's config.json") from None
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path}: not a run's config.json")
    return recorded


def _group(run_dir, name):
    """Group `name` of RUN_DIR/config.json as a dict ({} where none is recorded)."""
    recorded = _run_config(run_dir) or {}
    group = recorded.get(name)
    if group is None and name == "batching" and "max_length" in recorded:
        return recorded  # runs of 0.1.0 wrote a flat config
    if not isinstance(group, (dict, type(None))):
        raise ConfigError(f"{os.path.join(run_dir, 'config.json')}: {name} is not an object")
    return group or {}


def run_settings(run_dir, names):
    """The settings among `names` that RUN_DIR/config.json records, checked.

    Args:
        run_dir: str, a training output folder (one without config.json records none).
        names: iterable of setting names (`SETTINGS`' keys).

    Returns:
        dict of name to value, only for the names the file records.

    Raises:
        ConfigError: config.json is not a run's, or records a value of the
            wrong type or out of range (naming the file, setting and value).
    """
    found, groups = {}, {}
    for name in names:
        group_name = SETTINGS[name].group
        if group_name not in groups:  # the file read once a group, not once a setting
            groups[group_name] = _group(run_dir, group_name)
        group = groups[group_name]
        if name in group:
            try:
                found[name] = coerce(name, group[name])
                check_limits(name, found[name])
            except ConfigError as error:
                raise ConfigError(f"{os.path.join(run_dir, 'config.json')}: {error}") from None
    return found


def run_max_length(run_dir):
    """The `max_length` a training run used, from RUN_DIR/config.json, or None."""
    return _group(run_dir, "batching").get("max_length")


def run_tree_words(run_dir):
    """Whether a run's parser writes each word before its tag (`data.treebank_words`; bool)."""
    data = _group(run_dir, "data")
    return data.get("corpus") == "ptb" and data.get("treebank_words") is True


def run_decoding(run_dir):
    """The search settings a run records (its `decoding` group), else the defaults.

    Args:
        run_dir: str, a training output folder.

    Returns:
        dict of `DecodingConfig`'s fields (`beam_size`, `alpha`, `extra_length`,
        `tree_constraint`, `penalty_form`, `max_output_length`, `end_at_limit`).

    Raises:
        ConfigError: config.json is not a run's, or records a value of the
            wrong type or out of range (naming the file, setting and value).
    """
    settings = dataclasses.asdict(DecodingConfig())
    settings.update(run_settings(run_dir, settings))
    return settings
