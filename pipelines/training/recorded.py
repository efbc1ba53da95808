"""What a finished training run recorded in RUN_DIR/config.json, for the commands that follow it.

`kt export` and `kt translate` read a run's source length and search settings
from here, so the flags repeat nothing the recipe already said.
"""

import dataclasses
import json
import os

from pipelines.errors import ConfigError
from pipelines.training.config import DecodingConfig


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


def run_max_length(run_dir):
    """The `max_length` a training run used, from RUN_DIR/config.json, or None."""
    recorded = _run_config(run_dir)
    if recorded is None:
        return None
    # Runs of 0.1.0 wrote a flat config.
    return (recorded.get("batching") or recorded).get("max_length")


def run_decoding(run_dir):
    """The search settings a run records (its `decoding` group), else the defaults.

    Returns:
        dict with `beam_size`, `alpha`, `extra_length`.
    """
    recorded = (_run_config(run_dir) or {}).get("decoding") or {}
    defaults = dataclasses.asdict(DecodingConfig())
    return {name: recorded.get(name, default) for name, default in defaults.items()}
