"""A setting's value from JSON or a flag's string: its declared type, checked.

Apart from `config`, which declares the settings, so that the declarations
stay in one file of readable size.
"""

import json
import types
import typing

from pipelines.errors import ConfigError


def base_type(annotation):
    """`(base, optional, item)` of a type hint.

    `int | None` gives `(int, True, None)`; `list[str]` gives `(list, False, str)`.
    """
    optional = False
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional, annotation = True, members[0]
    if typing.get_origin(annotation) is list:
        return list, optional, typing.get_args(annotation)[0]
    return annotation, optional, None


_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}


def parse_scalar(value, kind, name, shown):
    """`value` as `kind`, from a JSON value or a flag's string; ConfigError if it is not one."""
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        if kind is bool and text in ("true", "false", "1", "0", "yes", "no"):
            return text in ("true", "1", "yes")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            pass
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise ConfigError(f"{name} must be {_NAMES[kind]}. Received: {name}={shown!r}")
    return value
