import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt
from pipelines.average import average_checkpoints
from pipelines.corpus import DataError


def saved_model(path, seed, **kwargs):
    keras.utils.set_random_seed(seed)
    arguments = dict(num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2)
    model = kt.Transformer(30, **{**arguments, **kwargs})
    model.build(((None, None), (None, None)))
    model.save(path)
    return model


def test_average_of_two_checkpoints_is_the_elementwise_mean(tmp_path):
    first = saved_model(tmp_path / "a.keras", 1)
    second = saved_model(tmp_path / "b.keras", 2)
    averaged = average_checkpoints(
        [str(tmp_path / "a.keras"), str(tmp_path / "b.keras")], str(tmp_path / "avg.keras")
    )
    reloaded = keras.saving.load_model(tmp_path / "avg.keras")
    for a, b, mean, saved in zip(
        first.get_weights(),
        second.get_weights(),
        averaged.get_weights(),
        reloaded.get_weights(),
        strict=True,
    ):
        assert not np.allclose(a, b) or a.std() == 0
        np.testing.assert_allclose(mean, (a + b) / 2, rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(saved, mean)


def test_average_refuses_different_architectures(tmp_path):
    saved_model(tmp_path / "a.keras", 1)
    saved_model(tmp_path / "b.keras", 1, hidden_dim=8, intermediate_dim=16)
    with pytest.raises(DataError, match="does not have the architecture"):
        average_checkpoints(
            [str(tmp_path / "a.keras"), str(tmp_path / "b.keras")], str(tmp_path / "x.keras")
        )
    with pytest.raises(DataError, match="Cannot load checkpoint"):
        average_checkpoints([str(tmp_path / "missing.keras")], str(tmp_path / "x.keras"))


def test_average_command_in_a_fresh_process(tmp_path):
    saved_model(tmp_path / "a.keras", 1)
    saved_model(tmp_path / "b.keras", 2)
    output = tmp_path / "avg.keras"
    command = [sys.executable, "-m", "pipelines.average", str(tmp_path / "a.keras"),
               str(tmp_path / "b.keras"), "--output", str(output)]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = average_checkpoints([str(tmp_path / "a.keras"), str(tmp_path / "b.keras")],
                                   str(tmp_path / "expected.keras"))  # fmt: skip
    reloaded = keras.saving.load_model(output).get_weights()
    for got, want in zip(reloaded, expected.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
