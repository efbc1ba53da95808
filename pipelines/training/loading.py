"""Where a `TrainConfig` comes from: a recipe, then a config file, then settings.

Recipes are `pipelines/training/recipes/NAME.json`; each source is a JSON
object nested by group (`{"batching": {"batch_tokens": 4096}}`) or of
`group.name` / `name` keys. The result is checked by `config.validate`.
"""

import importlib.resources
import json
import os

from pipelines.errors import ConfigError, DataError
from pipelines.files import check_input_file
from pipelines.training.config import GROUPS, SETTINGS, ModelConfig, TrainConfig, coerce, validate


def recipe_names():
    """The recipes shipped in `pipelines/training/recipes/`."""
    folder = importlib.resources.files("pipelines.training") / "recipes"
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def read_recipe(name):
    """Recipe `name`'s settings, nested by group."""
    if name not in recipe_names():
        raise ConfigError(f"recipe must be one of {recipe_names()}. Received: recipe={name!r}")
    path = importlib.resources.files("pipelines.training") / "recipes" / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8"))


def flatten(values, origin):
    """`{"group.name" or "name": value}` or a nested `{group: {name: value}}` -> `{name: value}`.

    Raises:
        ConfigError: for a name that is not a setting, or a group that is not an object.
    """
    if not isinstance(values, dict):
        raise ConfigError(f"{origin} must hold a JSON object of settings")
    flat = {}
    for key, value in values.items():
        if key in GROUPS and isinstance(value, dict):
            for name, inner in value.items():
                flat.update(flatten({f"{key}.{name}": inner}, origin))
            continue
        group, _, name = key.rpartition(".")
        if name not in SETTINGS or (group and SETTINGS[name].group != group):
            raise ConfigError(f"Unknown setting {key!r} in {origin}")
        flat[name] = value
    return flat


def _apply(config, values, origin):
    """Sets the flat `values` on `config`; a preset set here clears the model's other settings."""
    if "preset" in values and values["preset"] != config.model.preset:
        config.model = ModelConfig(preset=None)
    for name, value in sorted(values.items(), key=lambda item: item[0] != "preset"):
        setattr(getattr(config, SETTINGS[name].group), name, coerce(name, value))
    return config


def load_config(recipe="default", config_file=None, settings=None):
    """Builds and validates a `TrainConfig` from a recipe, a JSON file and settings.

    Args:
        recipe: str, a name in `recipe_names()`.
        config_file: str or None, a JSON object nested by group (or of
            `group.name` / `name` keys).
        settings: dict or None, `{name or group.name: value}` set last (flags
            and `--set`); values are JSON values or strings to parse.

    Returns:
        a validated `TrainConfig`.

    Raises:
        ConfigError: naming the file, setting and value at fault.
    """
    config = _apply(TrainConfig(), flatten(read_recipe(recipe), f"recipe {recipe!r}"), recipe)
    if config_file:
        if not os.path.isfile(config_file):
            raise ConfigError(f"config file not found: {config_file}")
        try:
            with open(config_file, encoding="utf-8") as handle:
                values = json.load(handle)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ConfigError(f"{config_file}: not valid JSON ({error})") from None
        config = _apply(config, flatten(values, config_file), config_file)
    return validate(_apply(config, flatten(settings or {}, "--set"), "--set"))


def check_paths(config):
    """Raises `DataError` unless the corpus files and folders the config names exist.

    Apart from `validate`, so that a configuration can be resolved and printed
    (`--print-config`) on a machine without the data.
    """
    data = config.data
    if data.corpus == "multi30k" and not os.path.isdir(data.multi30k_dir):
        raise DataError(f"multi30k_dir: Multi30k folder not found: {data.multi30k_dir}")
    if data.corpus == "ptb" and not os.path.isdir(data.treebank_dir):
        raise DataError(f"treebank_dir: treebank folder not found: {data.treebank_dir}")
    if data.corpus == "files":
        for name in ("train_files", "validation_files"):
            for path in getattr(data, name) or []:
                check_input_file(path, name)
