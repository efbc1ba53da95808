import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt
from pipelines.errors import CheckpointError
from pipelines.training.checkpoints import (
    average_checkpoints,
    checkpoints_to_average,
    epoch_checkpoints,
    load_checkpoint,
    with_dtype_policy,
)


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


def test_a_mixed_precision_model_computes_in_float32_with_the_same_weights(tmp_path):
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:  # converted, too, under the global policy a mixed-precision run leaves set
        saved_model(tmp_path / "mixed.keras", 1)
        loaded = keras.saving.load_model(tmp_path / "mixed.keras")
        converted = with_dtype_policy(loaded, "float32")
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert loaded.compute_dtype == "bfloat16"  # the policy travels with the file
    assert converted.compute_dtype == "float32" and loaded.compute_dtype == "bfloat16"
    for before, after in zip(loaded.get_weights(), converted.get_weights(), strict=True):
        np.testing.assert_array_equal(after, before)
    # The reference: a float32 model built on its own and given the same weights.
    keras.utils.set_random_seed(2)
    reference = kt.Transformer(30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2)
    reference.build(((None, None), (None, None)))
    reference.set_weights(loaded.get_weights())
    ids = np.array([[5, 6, 7, 3], [8, 9, 3, 0]], "int32"), np.array([[2, 5, 6], [2, 7, 0]], "int32")
    expected = keras.ops.convert_to_numpy(reference(ids))
    actual = keras.ops.convert_to_numpy(converted(ids))
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)
    narrow = keras.ops.convert_to_numpy(keras.ops.cast(loaded(ids), "float32"))
    assert np.abs(narrow - expected).max() > 1e-4  # bfloat16 would not pass the check above
    assert with_dtype_policy(converted, "float32") is converted


def test_epoch_checkpoints_are_ordered_by_epoch_past_999(tmp_path):
    for epoch in (999, 1000, 998, 1001, 5):
        (tmp_path / f"epoch-{epoch:03d}.keras").write_bytes(b"")
    (tmp_path / "epoch-best.keras").write_bytes(b"")  # not an epoch's
    names = [os.path.basename(p) for p in epoch_checkpoints(str(tmp_path))]
    assert names == [f"epoch-{e:03d}.keras" for e in (5, 998, 999, 1000, 1001)]
    assert sorted(names) != names  # what a name sort would get wrong


def test_a_checkpoint_of_unknown_classes_is_named_as_such(tmp_path):
    @keras.saving.register_keras_serializable(package="elsewhere")
    class Unknown(keras.layers.Layer):
        pass

    model = keras.Sequential([keras.Input((3,)), Unknown()])
    model.save(tmp_path / "other.keras")
    del keras.saving.get_custom_objects()["elsewhere>Unknown"]
    with pytest.raises(CheckpointError, match="holds a model of classes this package does not"):
        load_checkpoint(str(tmp_path / "other.keras"))


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


def test_average_takes_a_runs_newest_checkpoints(tmp_path, capsys):
    """`kt average --run-dir RUN --last N`: the newest N by step, never best.keras."""
    from pipelines.commands import average

    folder = tmp_path / "run" / "checkpoints"
    folder.mkdir(parents=True)
    for seed, name in enumerate(["step-000000900", "step-000001000", "step-000010000", "best"]):
        saved_model(folder / f"{name}.keras", seed)
    output = tmp_path / "avg.keras"
    argv = ["--run-dir", str(tmp_path / "run"), "--last", "2", "--output", str(output)]
    assert average.main(argv) == 0
    newest = [str(folder / "step-000001000.keras"), str(folder / "step-000010000.keras")]
    expected = average_checkpoints(newest, str(tmp_path / "expected.keras"))
    for got, want in zip(keras.saving.load_model(output).get_weights(), expected.get_weights(),
                         strict=True):  # fmt: skip
        np.testing.assert_array_equal(got, want)
    assert "Averaged 2 checkpoints" in capsys.readouterr().out
    argv = ["--run-dir", str(tmp_path / "run"), "--last", "9", "--output", str(output)]
    assert average.main(argv) == 0
    assert "warning: --last 9: " in capsys.readouterr().out  # three there, all averaged
    for argv, says in (
        (["--run-dir", str(tmp_path / "run")], "--run-dir needs --last N"),
        ([str(output), "--run-dir", str(tmp_path / "run"), "--last", "2"], "one of the two"),
        (["--run-dir", str(tmp_path), "--last", "2"], "holds no epoch- or step- file"),
        ([str(output), "--last", "2"], "--last counts a run's checkpoints: give --run-dir"),
    ):
        assert average.main([*argv, "--output", str(tmp_path / "x.keras")]) == 2
        assert says in capsys.readouterr().err
    assert not (tmp_path / "x.keras").exists()


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


def test_a_run_averages_its_last_checkpoints_or_a_share_of_them_if_more():
    from pipelines.training.config import OutputConfig
    from pipelines.training.loading import load_config

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
