import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt
from pipelines.errors import CheckpointError
from pipelines.training.checkpoints import average_checkpoints, checkpoints_to_average


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
    with pytest.raises(CheckpointError, match="does not have the architecture"):
        average_checkpoints(
            [str(tmp_path / "a.keras"), str(tmp_path / "b.keras")], str(tmp_path / "x.keras")
        )
    with pytest.raises(CheckpointError, match="Cannot load checkpoint"):
        average_checkpoints([str(tmp_path / "missing.keras")], str(tmp_path / "x.keras"))


def test_average_command_in_a_fresh_process(tmp_path):
    saved_model(tmp_path / "a.keras", 1)
    saved_model(tmp_path / "b.keras", 2)
    output = tmp_path / "avg.keras"
    command = [sys.executable, "-m", "pipelines", "average", str(tmp_path / "a.keras"),
               str(tmp_path / "b.keras"), "--output", str(output)]  # fmt: skip
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    expected = average_checkpoints([str(tmp_path / "a.keras"), str(tmp_path / "b.keras")],
                                   str(tmp_path / "expected.keras"))  # fmt: skip
    reloaded = keras.saving.load_model(output).get_weights()
    for got, want in zip(reloaded, expected.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)


def test_average_holds_at_most_two_models(tmp_path, monkeypatch):
    """A running sum: memory of two models however many checkpoints are averaged."""
    import gc
    import weakref

    from pipelines.training import checkpoints

    paths = [str(tmp_path / f"{seed}.keras") for seed in range(5)]
    expected = np.mean(
        [saved_model(path, seed).get_weights()[0] for seed, path in enumerate(paths)], axis=0
    )
    gc.collect()
    alive, most = weakref.WeakSet(), [0]
    load = keras.saving.load_model

    def counting_load(path, **kwargs):
        gc.collect()
        model = load(path, **kwargs)
        alive.add(model)
        most[0] = max(most[0], len(alive))
        return model

    monkeypatch.setattr(checkpoints.keras.saving, "load_model", counting_load)
    averaged = average_checkpoints(paths, str(tmp_path / "avg.keras"))
    assert most[0] <= 2
    np.testing.assert_allclose(averaged.get_weights()[0], expected, rtol=1e-6, atol=1e-7)


def _write_backup(folder, step):
    """A complete backup pair as BackupAndRestore writes it."""
    import h5py

    with h5py.File(folder / "latest.weights.h5", "w") as handle:
        handle["step"] = step
    (folder / "training_metadata.json").write_text(f'{{"epoch": {step}}}')


def test_repair_backup_restores_the_previous_copy_of_a_half_written_file(tmp_path):
    from pipelines.training.checkpoints import repair_backup

    _write_backup(tmp_path, 1)
    os.replace(tmp_path / "latest.weights.h5", tmp_path / "latest.weights.h5.bkp")
    (tmp_path / "latest.weights.h5").write_bytes(b"\x89HDF\r\n half written")
    assert repair_backup(str(tmp_path)) == "repaired"
    import h5py

    with h5py.File(tmp_path / "latest.weights.h5", "r") as handle:
        assert handle["step"][()] == 1
    assert not (tmp_path / "latest.weights.h5.bkp").exists()
    assert repair_backup(str(tmp_path)) == "intact"


def test_repair_backup_clears_a_backup_with_no_complete_copy(tmp_path):
    from pipelines.training.checkpoints import repair_backup

    _write_backup(tmp_path, 3)
    (tmp_path / "training_metadata.json").write_text('{"epoch": ')
    assert repair_backup(str(tmp_path)) == "cleared"
    assert os.listdir(tmp_path) == []


def test_a_run_averages_its_last_checkpoints_or_a_share_of_them_if_more():
    from pipelines.training.config import OutputConfig, load_config

    paths = [f"epoch-{epoch:03d}.keras" for epoch in range(1, 43)]

    def chosen(count=42, **settings):
        return checkpoints_to_average(paths[:count], OutputConfig(**settings))

    assert chosen() == ["epoch-042.keras"]
    assert chosen(average_last=5) == paths[37:]
    assert chosen(average_last=5, average_share=0.5) == paths[21:]  # 21 of 42
    assert chosen(22, average_last=5, average_share=0.5) == paths[11:22]  # a slower machine
    assert chosen(5, average_last=5, average_share=0.5) == paths[:5]  # 3 < 5
    assert chosen(average_last=5, average_share=0.01) == paths[37:]
    assert chosen(average_share=0.49) == paths[21:]  # 20.58 rounds up
    assert chosen(25, average_share=0.28) == paths[18:25]  # 7, though 0.28 * 25 > 7
    assert chosen(average_share=1.0) == chosen(average_last=99) == paths
    assert checkpoints_to_average([], OutputConfig(average_share=0.5)) == []
    # The ptb recipe averages its last half; docs/training.md's flags keep its last weights.
    ptb = {"treebank_dir": "t"}
    assert checkpoints_to_average(paths, load_config("ptb", settings=ptb).output) == paths[21:]
    last = {**ptb, "output.average_share": "0", "average_last": "1"}
    assert checkpoints_to_average(paths, load_config("ptb", settings=last).output) == paths[-1:]
    # The multi30k recipe averages its last 70%: 61 of the 86 checkpoints its val study had.
    runs = [f"epoch-{epoch:03d}.keras" for epoch in range(1, 87)]
    output = load_config("multi30k", settings={"multi30k_dir": "m"}).output
    assert checkpoints_to_average(runs, output) == runs[25:]
    assert checkpoints_to_average(paths, load_config("default").output) == paths[-3:]  # as before
