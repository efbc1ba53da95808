"""A long run's machinery: backups, checkpoints that fit the disk, EMA, the run folder's lock."""

import json
import logging
import os
import zipfile

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from pipelines.commands.train import main
from pipelines.errors import CheckpointError
from pipelines.files import run_folder_lock
from pipelines.training.backup import RunBackup, backup_folders
from pipelines.training.callbacks import Checkpoints, save_weights_checkpoint
from pipelines.training.checkpoints import epoch_checkpoints
from pipelines.training.trainer import Trainer
from tests.pipelines.training.shared import TINY
from tests.test_case import token_batch

ONE = tf.distribute.OneDeviceStrategy("/cpu:0")


def tiny_trainer(**optimizer_options):
    keras.utils.set_random_seed(3)
    with ONE.scope():
        model = kt.Transformer(
            30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2, dropout=0.0
        )
        model.build(((None, None), (None, None)))
        optimizer = keras.optimizers.Adam(1e-2, **optimizer_options)
    return Trainer(model, optimizer, ONE)


def batches(count):
    data = [tf.nest.map_structure(tf.constant, token_batch(i)) for i in range(count)]
    dataset = tf.data.Dataset.from_tensors(data[0])
    for batch in data[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return dataset.repeat()


def test_a_backup_is_whole_or_absent_and_only_the_newest_is_kept(tmp_path):
    trainer = tiny_trainer()
    backup = RunBackup(str(tmp_path), every=2)
    trainer.fit(batches(3), steps=5, steps_per_epoch=5, backup=backup, verbose=0)
    assert [step for step, _ in backup_folders(str(tmp_path))] == [5]  # the end's backup
    # A kill while writing leaves a staging folder, never a step folder without its state.
    (tmp_path / ".staging-1@elsewhere-x").mkdir()
    (tmp_path / "step-000000007").mkdir()  # renamed in whole, so this one is not a backup
    assert RunBackup(str(tmp_path)).latest_step() == 5
    again = tiny_trainer()
    state = RunBackup(str(tmp_path)).restore(again.model, None)
    assert state["step"] == 5 and int(again.optimizer.iterations) == 5
    pairs = zip(trainer.optimizer.variables, again.optimizer.variables, strict=True)
    for expected, actual in pairs:
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected))


def test_a_backup_of_an_earlier_version_is_refused_by_name(tmp_path):
    (tmp_path / "training_metadata.json").write_text('{"epoch": 3}')
    with pytest.raises(CheckpointError, match="earlier version of this package"):
        RunBackup(str(tmp_path)).restore(tiny_trainer().model, None)


def test_checkpoints_hold_weights_alone_and_the_oldest_are_removed(tmp_path):
    trainer = tiny_trainer()
    clock = iter(range(0, 10_000, 100)).__next__  # 100 s a reading: 6 readings a checkpoint
    checkpoints = Checkpoints(str(tmp_path), minutes=10, keep=2, clock=clock)
    trainer.fit(batches(2), steps=14, steps_per_epoch=7, callbacks=[checkpoints], verbose=0)
    written = [os.path.basename(p) for p in checkpoints.written]
    # Every 10 minutes, and at the end: the average of the last ones holds the last steps.
    assert written == ["step-000000006.keras", "step-000000012.keras", "step-000000014.keras"]
    assert [os.path.basename(p) for p in epoch_checkpoints(str(tmp_path))] == written[1:]
    last = keras.saving.load_model(checkpoints.written[-1])
    for expected, actual in zip(trainer.model.get_weights(), last.get_weights(), strict=True):
        np.testing.assert_array_equal(actual, expected)
    # An end less than half an interval after the last checkpoint replaces it.
    clock = iter(range(0, 10_000, 100)).__next__
    close = Checkpoints(str(tmp_path / "close"), minutes=10, clock=clock)
    tiny_trainer().fit(batches(2), steps=13, steps_per_epoch=13, callbacks=[close], verbose=0)
    assert sorted(os.listdir(tmp_path / "close")) == [
        "step-000000006.keras",
        "step-000000013.keras",
    ]
    path = os.path.join(str(tmp_path), "all.keras")
    save_weights_checkpoint(trainer.model, path)
    with zipfile.ZipFile(path) as archive, archive.open("model.weights.h5") as weights:
        with h5py.File(weights, "r") as h5:
            assert "optimizer" not in h5.keys()  # Adam's moments stay in the backup
    assert trainer.model.optimizer is trainer.optimizer  # attached again after the save
    loaded = keras.saving.load_model(path)
    for expected, actual in zip(trainer.model.get_weights(), loaded.get_weights(), strict=True):
        np.testing.assert_array_equal(actual, expected)
    # Keeping the newest 2 of 4 epoch checkpoints.
    keep = Checkpoints(str(tmp_path / "epochs"), keep=2)
    tiny_trainer().fit(batches(2), steps=8, steps_per_epoch=2, callbacks=[keep], verbose=0)
    assert sorted(os.listdir(tmp_path / "epochs")) == ["epoch-003.keras", "epoch-004.keras"]


def test_ema_weights_are_the_moving_average_of_each_step(tmp_path):
    momentum = 0.5
    trainer = tiny_trainer(use_ema=True, ema_momentum=momentum)
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(trainer.model.get_weights())
    )
    trainer.fit(batches(3), steps=4, steps_per_epoch=4, callbacks=[record], verbose=0)
    average = seen[0]  # the first step's weights start the average
    for weights in seen[1:]:
        average = [momentum * a + (1 - momentum) * w for a, w in zip(average, weights, strict=True)]
    trained = trainer.model.get_weights()
    with trainer.ema_weights() as model:
        for expected, actual in zip(average, model.get_weights(), strict=True):
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    for expected, actual in zip(trained, trainer.model.get_weights(), strict=True):
        np.testing.assert_array_equal(actual, expected)  # its own weights back


def test_a_finished_run_given_more_steps_goes_on_from_its_last_step(tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--output-dir", str(out), "--steps-per-epoch", "2", *TINY, "--heldout-split", "none"]
    assert main([*flags, "--steps", "4"]) == 0
    first = json.loads((out / "result.json").read_text())
    assert main([*flags, "--steps", "6"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["resumed_at_step"] == 4 and result["steps"] == 6
    assert len(result["history"]["loss"]) == 1  # the third epoch alone
    assert result["history"]["loss"][0] < first["history"]["loss"][0]  # not from scratch
    # Without its backup the run cannot go on, and is not started over either.
    for _, path in backup_folders(str(out / "backup")):
        for name in os.listdir(path):
            os.remove(os.path.join(path, name))
        os.rmdir(path)
    model_bytes = (out / "model.keras").read_bytes()
    capsys.readouterr()
    assert main([*flags, "--steps", "8"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: output_dir") and "no backup to continue from" in err
    assert (out / "model.keras").read_bytes() == model_bytes


def test_a_run_folder_in_use_is_refused_naming_its_process(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    with run_folder_lock(str(out), "output_dir"):
        assert main(["--output-dir", str(out), "--steps", "2", *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: output_dir") and f"process {os.getpid()}" in err
    assert sorted(os.listdir(out)) == []  # nothing prepared, the lock file gone with its holder


def test_a_resume_may_rebatch_an_update_and_the_data_order_starts_anew(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "run"
    flags = ["--output-dir", str(out), "--steps-per-epoch", "2", *TINY, "--heldout-split", "none"]
    assert main([*flags, "--steps", "2"]) == 0
    # 512 tokens x 1 -> 256 x 2: the same tokens an update, after an out-of-memory error say.
    assert main([*flags, "--steps", "4", "--batch-tokens", "256", "--accumulation-steps", "2"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["resumed_at_step"] == 2 and result["steps"] == 4
    assert "The data order starts anew at step 2" in caplog.text
    assert "Skipping" not in caplog.text  # no batches read past: a new order, not a replay
    # Larger updates only when asked, naming the settings and the flag.
    capsys.readouterr()
    assert main([*flags, "--steps", "6", "--batch-tokens", "1024"]) == 2
    err = capsys.readouterr().err
    assert "batch_tokens x accumulation_steps 256 x 2 -> 1024 x 1" in err
    assert "--restart-data-order" in err
    assert main([*flags, "--steps", "6", "--batch-tokens", "1024", "--restart-data-order"]) == 0
    assert json.loads((out / "result.json").read_text())["resumed_at_step"] == 4


def test_data_order_seed_is_the_runs_until_a_restart():
    from pipelines.training.backup import data_order_seed

    assert data_order_seed(7) == 7
    restarted = {data_order_seed(7, step) for step in (2, 4)} | {data_order_seed(8, 2)}
    assert len(restarted) == 3 and 7 not in restarted
    assert data_order_seed(7, 2) == data_order_seed(7, 2)  # every worker draws the same


def test_validation_bleu_picks_the_best_checkpoint_that_model_keras_holds(tmp_path):
    out = tmp_path / "run"
    flags = ["--output-dir", str(out), "--steps", "6", "--steps-per-epoch", "2", *TINY]
    scoring = ["--validation-sentences", "20", "--metric", "chrf", "--select", "best"]
    assert main([*flags, *scoring, "--heldout-split", "none", "--ema", "0.9"]) == 0
    history = json.loads((out / "result.json").read_text())["history"]
    assert len(history["val_bleu"]) == len(history["val_chrf"]) == 3
    assert all(0.0 <= bleu <= 100.0 for bleu in history["val_bleu"])
    best = json.loads((out / "checkpoints" / "best.json").read_text())
    assert best["val_chrf"] == pytest.approx(max(history["val_chrf"]), abs=1e-4)
    assert best["step"] == 2 * (1 + history["val_chrf"].index(max(history["val_chrf"])))
    chosen, kept = (
        keras.saving.load_model(out / name) for name in ("model.keras", "checkpoints/best.keras")
    )
    for expected, actual in zip(kept.get_weights(), chosen.get_weights(), strict=True):
        np.testing.assert_array_equal(actual, expected)


def test_select_ema_writes_the_moving_average_into_model_keras(tmp_path):
    out = tmp_path / "run"
    flags = ["--output-dir", str(out), "--steps", "4", "--steps-per-epoch", "2", *TINY]
    assert main([*flags, "--heldout-split", "none", "--ema", "0.5", "--select", "ema"]) == 0
    ema = keras.saving.load_model(out / "model.keras").get_weights()
    last = keras.saving.load_model(out / "checkpoints" / "epoch-002.keras").get_weights()
    previous = keras.saving.load_model(out / "checkpoints" / "epoch-001.keras").get_weights()
    # Not the last weights, but between them and earlier ones, weight by weight.
    assert any(not np.array_equal(a, b) for a, b in zip(ema, last, strict=True))
    moved = [
        np.abs(average - end).sum() <= np.abs(before - end).sum()
        for average, end, before in zip(ema, last, previous, strict=True)
    ]
    assert all(moved)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--metric", "bleu"], "metric bleu needs validation_sentences"),
        (["--select", "ema"], "select ema needs optimization.ema"),
        (["--keep-checkpoints", "3", "--average-share", "0.5"], "set average_last instead"),
        (["--ema", "1.0"], "ema must be less than 1.0"),
    ],
)
def test_long_run_settings_that_cannot_work_are_refused_before_any_work(
    tmp_path, capsys, flags, message
):
    out = tmp_path / "run"
    assert main(["--output-dir", str(out), *flags, *TINY]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err
    assert not out.exists() or list(out.iterdir()) == []


def sgd_step(strategy, steps=1):
    """`(history, moved)`: SGD(0.5) steps of a seeded tiny model on the first batch, repeated."""
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = kt.Transformer(
            30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2, dropout=0.0
        )
        model.build(((None, None), (None, None)))
        optimizer = keras.optimizers.SGD(0.5)
    trainer = Trainer(model, optimizer, strategy)
    before = model.get_weights()
    history = trainer.fit(batches(1), steps=steps, steps_per_epoch=1, verbose=0)
    moved = [(a - b).ravel() for a, b in zip(model.get_weights(), before, strict=True)]
    return history, np.concatenate(moved)


def test_the_logged_gradient_norm_is_the_norm_of_the_update_sgd_took():
    history, moved = sgd_step(ONE)
    expected = np.linalg.norm(moved) / 0.5  # SGD's step is rate times gradient
    assert history.history["gradient_norm"][0] == pytest.approx(expected, rel=1e-4)
    assert history.history["learning_rate"][0] == pytest.approx(0.5)


@pytest.mark.skipif(len(tf.config.list_logical_devices("CPU")) < 2, reason="needs 2 CPU devices")
def test_the_gradient_norm_under_two_replicas_is_the_summed_gradients_and_the_update_the_same():
    from pipelines.training.parallel import make_strategy

    mirrored = make_strategy()[0]
    assert mirrored.num_replicas_in_sync == 2
    one_history, one_moved = sgd_step(ONE)
    history, moved = sgd_step(mirrored, steps=2)
    # The first step is measured: the norm of the whole batch's gradient, one device's.
    norms = history.history["gradient_norm"]
    assert norms[0] == pytest.approx(one_history.history["gradient_norm"][0], rel=1e-4)
    # The second is not (-1 inside), so its epoch carries the first's.
    assert norms[1] == norms[0]
    # Measuring handed the optimizer a replica's share: the first update is one device's.
    _, first_moved = sgd_step(mirrored)
    np.testing.assert_allclose(first_moved, one_moved, rtol=1e-4, atol=1e-6)
    assert not np.allclose(moved, first_moved)  # the second step moved on


def test_import_and_average_into_a_run_folder_in_use_are_refused(tmp_path, capsys):
    from pipelines.commands import average, import_model

    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")
    checkpoint = tmp_path / "a.keras"
    save_weights_checkpoint(tiny_trainer().model, str(checkpoint))
    with run_folder_lock(str(out), "output_dir"):
        refused = [
            import_model.main(["marian", str(tmp_path / "none"), "--output-dir", str(out)]),
            average.main([str(checkpoint), "--output", str(out / "model.keras")]),
        ]
    assert refused == [2, 2]
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all(f"process {os.getpid()}" in line for line in errors)
    assert sorted(os.listdir(out)) == ["config.json"]
