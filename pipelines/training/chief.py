"""The chief and the workers of a run meet over its data folder, and fail together.

The chief (worker or process 0) prepares the data; every other worker waits
for its `ready.json`. So that no worker waits forever, the chief writes
`failed.json` on any exception of its preparation, and beats in
`chief.json` while it prepares: a worker whose chief was killed, or lost its
machine, stops within `SILENT_SECONDS` of the last beat, with one error line.
A shared folder rather than the workers' collectives: the collectives meet
once the strategy starts, and a collective that one side never joins waits
without a deadline.
"""

import contextlib
import logging
import os
import socket
import threading
import time

from pipelines.data.progress import PROGRESS_SECONDS
from pipelines.errors import DataError, UsageError
from pipelines.files import read_json, write_json

logger = logging.getLogger(__name__)

# Written by the chief once the training and validation data are complete, or once it failed.
READY, FAILED = "ready.json", "failed.json"
# Rewritten by the chief every `BEAT_SECONDS` while it prepares.
ALIVE, BEAT_SECONDS = "chief.json", 5.0
# A waiting worker gives up on a chief whose beat has not changed this long (by the
# worker's own clock: the machines' clocks may differ), or that has not begun to beat.
SILENT_SECONDS, FIRST_BEAT_SECONDS = 40.0, 120.0
# Seconds between two looks of a waiting worker.
POLL_SECONDS = 5.0


def clear_marks(chief_dir):
    """Removes an earlier attempt's ready and failed marks: the chief's first step.

    Called before the workers meet (the strategy or distribution starts),
    so none of them can take an earlier attempt's mark for this one's.
    """
    for name in (READY, FAILED, ALIVE):
        path = os.path.join(chief_dir, "data", name)
        if os.path.exists(path):
            os.remove(path)


@contextlib.contextmanager
def failing_together(data_dir):
    """The chief's preparation in `data_dir`, beating, and any exception written for the workers.

    Raises:
        whatever the preparation raises, after writing it to `failed.json`.
    """
    with _beating(data_dir):
        try:
            yield
        except BaseException as error:
            with contextlib.suppress(OSError):  # a full disk: the workers see the beat stop
                write_json(os.path.join(data_dir, FAILED), {"error": _described(error)})
            raise


def _described(error):
    if isinstance(error, UsageError):
        return str(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


@contextlib.contextmanager
def _beating(data_dir):
    """Rewrites `data_dir/chief.json` (a count, this host and process) every `BEAT_SECONDS`."""
    os.makedirs(data_dir, exist_ok=True)
    stop = threading.Event()
    path = os.path.join(data_dir, ALIVE)
    me = {"host": socket.gethostname(), "pid": os.getpid()}

    def write(count):
        with contextlib.suppress(OSError):
            write_json(path, {**me, "beat": count})

    def beat():
        count = 1
        while not stop.wait(BEAT_SECONDS):
            write(count)
            count += 1

    write(0)  # beating before the work begins
    thread = threading.Thread(target=beat, name="chief-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def wait_for_chief(data_dir, clock=time.monotonic, sleep=time.sleep):
    """Waits for the chief's ready mark in `data_dir`, its failed one, or its silence.

    Returns:
        str, the ready mark's path.

    Raises:
        DataError: with the chief's error, where its preparation failed; or
            where its beat (`chief.json`) stopped for `SILENT_SECONDS`, or
            never began in `FIRST_BEAT_SECONDS` (the chief was killed, or
            its machine lost).
    """
    started = last = changed = clock()
    beat = None
    while not os.path.exists(os.path.join(data_dir, READY)):
        if os.path.exists(os.path.join(data_dir, FAILED)):
            error = read_json(os.path.join(data_dir, FAILED))["error"]
            raise DataError(f"the chief's data preparation failed: {error}")
        now = _read_beat(data_dir)
        if now != beat:
            beat, changed = now, clock()
        elif beat is None and clock() - changed >= FIRST_BEAT_SECONDS:
            raise DataError(
                f"the chief has not begun preparing the data in {data_dir} in "
                f"{clock() - started:.0f} s (no {ALIVE}): it is not running; restart every worker"
            )
        elif beat is not None and clock() - changed >= SILENT_SECONDS:
            raise DataError(
                f"the chief stopped preparing the data in {data_dir}: its {ALIVE} "
                f"(host {beat.get('host')}, process {beat.get('pid')}) has not changed in "
                f"{clock() - changed:.0f} s; it was killed or lost its machine. "
                "Restart every worker"
            )
        if clock() - last >= PROGRESS_SECONDS:
            last = clock()
            logger.info("Waiting for the chief's data in %s (%.0f s)", data_dir, last - started)
        sleep(POLL_SECONDS)
    return os.path.join(data_dir, READY)


def _read_beat(data_dir):
    try:
        return read_json(os.path.join(data_dir, ALIVE))
    except (OSError, ValueError):  # not there yet, or removed by a restarting chief
        return None
