"""Command-line entry points: parse, call the library, report.

Each module here is one `kt` subcommand (`pipelines.cli` dispatches to its
`main(argv, prog)`). They all end the same way through `run`: 0 on success,
and for a `UsageError` one `error: ...` line on stderr and exit status 2.
"""

import sys

from pipelines.errors import UsageError


def run(body, *args, **kwargs):
    """Calls `body(*args, **kwargs)` and turns a `UsageError` into exit status 2.

    Args:
        body: callable that does the command's work and returns its exit status
            (None counts as 0).

    Returns:
        int, the exit status for `sys.exit`.
    """
    try:
        status = body(*args, **kwargs)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0 if status is None else status
