"""Commands killed with SIGKILL, or run twice at once, lose nothing and leave nothing broken."""

import os
import shutil
import signal
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from pipelines.files import STAGING
from tests.pipelines.conftest import tiny_translation_model

pytestmark = pytest.mark.slow
ENV = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "3"}
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def kt(*argv):
    """Starts `python -m pipelines ARGV` (stdout and stderr to pipes)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines", *map(str, argv)],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def kill_when(process, ready, timeout=300):
    """SIGKILLs `process` once `ready()` holds (or it ended); True if it was killed."""
    deadline = time.time() + timeout
    while process.poll() is None and not ready() and time.time() < deadline:
        time.sleep(0.05)
    if process.poll() is not None:
        return False
    process.send_signal(signal.SIGKILL)
    process.wait()
    return True


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    for seed in (1, 2):
        model, _ = tiny_translation_model(
            root, 120, seed=seed, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2
        )
        model.save(root / f"epoch-{seed}.keras")
    model.save(root / "model.keras")
    return root


def weights(path):
    return [np.asarray(w) for w in keras.saving.load_model(path).get_weights()]


def staging_seen(folder, delay):
    """A `ready` for `kill_when`: `delay` seconds after a staging file appears in `folder`."""
    seen = []

    def ready():
        if not seen and any(n.startswith(STAGING) for n in os.listdir(folder)):
            seen.append(time.time())
        return bool(seen) and time.time() - seen[0] >= delay

    return ready


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.1])
def test_averaging_killed_while_it_writes_keeps_the_previous_average(run_dir, tmp_path, delay):
    output = tmp_path / "average.keras"
    shutil.copy(run_dir / "epoch-1.keras", output)
    previous = weights(output)
    checkpoints = [run_dir / "epoch-1.keras", run_dir / "epoch-2.keras"]
    killed = kill_when(
        kt("average", *checkpoints, "--output", output), staging_seen(tmp_path, delay)
    )
    now = weights(output)  # loads: never a broken file
    first, second = (weights(path) for path in checkpoints)
    expected = [(a + b) / 2 for a, b in zip(first, second, strict=True)]
    kept = all(np.allclose(n, p) for n, p in zip(now, previous, strict=True))
    averaged = all(np.allclose(n, e, atol=1e-6) for n, e in zip(now, expected, strict=True))
    assert kept or averaged
    assert averaged or killed
    # The next run clears what the killed one left.
    assert kt("average", *checkpoints, "--output", output).wait() == 0
    assert sorted(os.listdir(tmp_path)) == ["average.keras"]
    assert all(np.allclose(n, e, atol=1e-6) for n, e in zip(weights(output), expected, strict=True))


def test_two_exports_at_once_take_two_versions_and_a_killed_one_is_cleaned_up(run_dir, tmp_path):
    flags = ["export", "--run-dir", run_dir, "--max-source-length", 16, "--base", tmp_path,
             "--name", "m", "--beam-size", 2, "--nbest", 2]  # fmt: skip
    base = tmp_path / "m"
    killed = kt(*flags)
    staging = lambda: base.is_dir() and any(n.startswith(STAGING) for n in os.listdir(base))  # noqa: E731
    assert kill_when(killed, staging)
    assert not [n for n in os.listdir(base) if n.isdigit()]
    first, second = kt(*flags), kt(*flags)
    for process in (first, second):
        _, err = process.communicate(timeout=600)
        assert process.returncode == 0, err[-2000:]
    assert sorted(os.listdir(base)) == ["1", "2"]
    for version in ("1", "2"):
        assert (base / version / "saved_model.pb").is_file()


def test_a_killed_translation_restarted_gives_the_whole_translation(run_dir, tmp_path):
    flags = ["--run-dir", run_dir, "--max-source-length", 16, "--base", tmp_path, "--name", "m"]
    assert kt("export", *flags, "--beam-size", 1, "--nbest", 1).wait() == 0
    source = tmp_path / "in.en"
    source.write_text("".join(f"{day} March {day}, 2014\n" for day in range(1, 41)))
    common = ["translate", "--model", tmp_path / "m", "--input", source, "--beam-size", 1]
    whole = tmp_path / "whole.de"
    assert kt(*common, "--output", whole).wait() == 0
    output, partial = tmp_path / "out.de", tmp_path / "out.de.partial"

    def some_lines():
        return partial.exists() and partial.read_text().count("\n") >= 4

    assert kill_when(kt(*common, "--output", output, "--batch-size", 2), some_lines)
    assert not output.exists()
    process = kt(*common, "--output", output, "--batch-size", 2)
    _, err = process.communicate(timeout=600)
    assert process.returncode == 0, err[-2000:]
    assert "resuming after" in err
    assert output.read_text() == whole.read_text()
    assert not partial.exists()
