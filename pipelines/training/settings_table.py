"""The settings table of docs/settings.md, made from the declarations in `config`.

Regenerate it with `python -m pipelines.training.settings_table`; a test
checks the docs hold it.
"""

import json

from pipelines.training.config import SETTINGS, base_type


def settings_markdown():
    """A Markdown table of every setting: name, type, default, limits, help (docs/settings.md)."""
    rows = ["| setting | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for item in SETTINGS.values():
        base, optional, member = base_type(item.type)
        kind = f"list of {member.__name__}" if base is list else base.__name__
        kind += " or null" if optional else ""
        limits = item.limits
        allowed = []
        if "choices" in limits:
            allowed.append(" / ".join(f"`{c}`" for c in limits["choices"]))
        for key, words in (("low", ">="), ("above", ">"), ("high", "<="), ("below", "<")):
            if key in limits:
                allowed.append(f"{words} {limits[key]}")
        if "nargs" in limits:
            allowed.append(f"{limits['nargs']} values")
        default = json.dumps(item.default)
        rows.append(
            f"| `{item.group}.{item.name}` | {kind} | `{default}` | {', '.join(allowed)} | "
            f"{item.help} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(settings_markdown(), end="")
