"""Output files a long command writes line by line and resumes after a kill.

`kt translate` and `kt parse` write finished lines to `OUTPUT.partial`, with
`OUTPUT.partial.json` recording what the lines depend on (input, model,
settings); a rerun with the same state keeps the complete lines and goes on.
"""

import json
import os
import sys

from pipelines.files import write_json


def export_identity(version):
    """What identifies a SavedModel version for a resume: `[abspath, graph bytes, graph mtime ns]`.

    Args:
        version: str, a version folder holding `saved_model.pb`.
    """
    graph = os.stat(os.path.join(version, "saved_model.pb"))
    return [os.path.abspath(version), graph.st_size, graph.st_mtime_ns]


def resume_point(partials, state, resume=True):
    """Input lines already done in `partials` by an earlier run with the same `state`, else 0.

    Args:
        partials: list of `(path, lines_per_input)`; the first one's
            `PATH.json` records the state.
        state: JSON-able dict, what the lines depend on.
        resume: bool; False starts over whatever the files hold (for a run
            whose other output, such as stdout, cannot be resumed with them).

    Returns:
        int; every partial file is cut to that many inputs' lines.
    """
    sidecar = f"{partials[0][0]}.json"
    try:
        with open(sidecar, encoding="utf-8") as handle:
            same = resume and json.load(handle) == state
        contents = []
        for path, _ in partials:
            with open(path, "rb") as handle:
                contents.append(handle.read())
    except (OSError, ValueError):
        same = False
    if not same:
        # Emptied before the new state is recorded: a kill in between leaves
        # no lines under a state they do not belong to.
        for path, _ in partials:
            with open(path, "wb") as handle:
                os.fsync(handle.fileno())
        write_json(sidecar, state)
        return 0
    done = min(data.count(b"\n") // per for data, (_, per) in zip(contents, partials, strict=True))
    for data, (path, per) in zip(contents, partials, strict=True):
        # Complete inputs only: a line cut by the kill, or an input's lines
        # written in part, are redone.
        keep = 0
        for _ in range(done * per):
            keep = data.index(b"\n", keep) + 1
        with open(path, "r+b") as handle:
            handle.truncate(keep)
    return done


def read_input_lines(data):
    """Lines of `data` bytes, without line endings; a final line break ends the last line."""
    lines = [line.rstrip(b"\r") for line in data.split(b"\n")]
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def write_lines(handle, lines):
    """Appends `lines` (list of str), one a line, and flushes them to disk (a file) or stdout."""
    handle.write("".join(f"{line}\n" for line in lines))
    handle.flush()
    if handle is not sys.stdout:
        os.fsync(handle.fileno())
