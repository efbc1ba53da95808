"""A run's data as the chief prepares it and the other workers wait for it."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from pipelines.errors import DataError
from pipelines.training import chief, data


def test_a_worker_waits_for_the_chiefs_mark_and_stops_with_its_error(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    looks = []

    def sleep(seconds):  # the chief finishes while the worker waits
        looks.append(seconds)
        if len(looks) == 3:
            (folder / chief.READY).write_text(json.dumps({"validation": False}))

    assert chief.wait_for_chief(str(folder), sleep=sleep) == str(folder / chief.READY)
    assert looks == [chief.POLL_SECONDS] * 3
    (folder / chief.READY).unlink()
    (folder / chief.FAILED).write_text(json.dumps({"error": "a.en, line 3: not valid UTF-8"}))
    with pytest.raises(DataError, match="chief's data preparation failed: a.en, line 3"):
        chief.wait_for_chief(str(folder), sleep=lambda seconds: None)
    chief.clear_marks(str(tmp_path))
    assert list(folder.iterdir()) == []


class FakeClock:
    """A clock that each sleep moves on, and a hook called at each look."""

    def __init__(self, on_sleep=None):
        self.now, self.on_sleep = 0.0, on_sleep

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds
        if self.on_sleep:
            self.on_sleep(self.now)


def test_a_worker_stops_when_the_chiefs_beat_stops_or_never_begins(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    beat = folder / chief.ALIVE

    def beating_until_60(now):  # the chief beats every BEAT_SECONDS, then is killed at 60 s
        if now <= 60:
            beat.write_text(json.dumps({"host": "h", "pid": 7, "beat": int(now)}))

    clock = FakeClock(beating_until_60)
    with pytest.raises(DataError, match=r"chief stopped preparing .* process 7\) has not changed"):
        chief.wait_for_chief(str(folder), clock=clock, sleep=clock.sleep)
    assert 60 + chief.SILENT_SECONDS <= clock.now <= 60 + chief.SILENT_SECONDS + chief.POLL_SECONDS
    assert chief.SILENT_SECONDS + chief.POLL_SECONDS + chief.BEAT_SECONDS < 60  # the promise

    beat.unlink()
    clock = FakeClock()
    with pytest.raises(DataError, match="has not begun preparing"):
        chief.wait_for_chief(str(folder), clock=clock, sleep=clock.sleep)
    assert chief.FIRST_BEAT_SECONDS <= clock.now <= chief.FIRST_BEAT_SECONDS + chief.POLL_SECONDS


def test_any_failure_of_the_chief_reaches_the_workers(tmp_path, monkeypatch):
    from pipelines.training.loading import load_config

    out = tmp_path / "run"
    config = load_config(settings={"output_dir": str(out)})

    def full_disk(*args):
        assert (out / "data" / chief.ALIVE).exists()  # beating while it prepares
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(data, "_prepare_data", full_disk)
    with pytest.raises(OSError):
        data.prepare_data(config, str(out), workers=2)
    with pytest.raises(DataError, match=r"failed: OSError: \[Errno 28\] No space left on device"):
        chief.wait_for_chief(str(out / "data"), sleep=lambda seconds: None)
    beats = json.loads((out / "data" / chief.ALIVE).read_text())["beat"]
    time.sleep(chief.BEAT_SECONDS + 0.5)  # the beat stopped with the preparation
    assert json.loads((out / "data" / chief.ALIVE).read_text())["beat"] == beats


@pytest.mark.slow  # the chief is a process of its own, killed; the worker waits out the silence
def test_a_chief_killed_while_it_prepares_ends_the_waiting_worker_within_a_minute(tmp_path):
    out = tmp_path / "run"
    script = f"""
from pipelines.training import data
from pipelines.training.loading import load_config
config = load_config(settings={{"output_dir": {str(out)!r},
                               "default_corpus_sizes": [400000, 20, 20]}})
data.prepare_data(config, {str(out)!r}, workers=2)
"""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=subprocess.PIPE)
    beat = out / "data" / chief.ALIVE
    deadline = time.monotonic() + 120
    while not beat.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert beat.exists(), process.stderr.read().decode()[-2000:] if process.poll() else "no beat"
    time.sleep(1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed = time.monotonic()
    assert not (out / "data" / chief.READY).exists()  # killed during the preparation
    with pytest.raises(DataError, match="chief stopped preparing"):
        chief.wait_for_chief(str(out / "data"))
    assert time.monotonic() - killed < 60
