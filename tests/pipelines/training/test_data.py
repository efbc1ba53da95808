"""A run's data as the chief prepares it and the other workers wait for it."""

import json

import pytest

from pipelines.errors import DataError
from pipelines.training import data


def test_a_worker_waits_for_the_chiefs_mark_and_stops_with_its_error(tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    looks = []

    def sleep(seconds):  # the chief finishes while the worker waits
        looks.append(seconds)
        if len(looks) == 3:
            (folder / data.READY).write_text(json.dumps({"validation": False}))

    assert data.wait_for_chief(str(folder), sleep=sleep) == str(folder / data.READY)
    assert looks == [data.POLL_SECONDS] * 3
    (folder / data.READY).unlink()
    (folder / data.FAILED).write_text(json.dumps({"error": "a.en, line 3: not valid UTF-8"}))
    with pytest.raises(DataError, match="chief's data preparation failed: a.en, line 3"):
        data.wait_for_chief(str(folder), sleep=lambda seconds: None)
    data.clear_marks(str(tmp_path))
    assert list(folder.iterdir()) == []
