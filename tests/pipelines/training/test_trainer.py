import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from pipelines.training.run import make_strategy
from pipelines.training.trainer import TimeBudget, Trainer
from tests.pipelines.conftest import two_cpus

# Mirrored tests share the process's one strategy (see make_strategy).
needs_two_cpus = pytest.mark.skipif(not two_cpus(), reason="needs 2 logical CPU devices")


def make_batch(seed, batch_size=8, source_length=7, target_length=6):
    rng = np.random.default_rng(seed)
    source = rng.integers(4, 30, (batch_size, source_length))
    target = rng.integers(4, 30, (batch_size, target_length + 1))
    # Unequal padding, so replicas and micro-batches hold unequal token counts.
    for row in range(batch_size):
        source[row, source_length - row % 4 :] = 0
        target[row, target_length + 1 - row % 5 :] = 0
    as_int = lambda x: tf.constant(x, tf.int32)  # noqa: E731
    return ((as_int(source), as_int(target[:, :-1])), as_int(target[:, 1:]))


def split(batch, parts):
    (source, target_input), target_output = batch
    size = source.shape[0] // parts
    return [
        tuple(
            (
                (source[i * size : (i + 1) * size], target_input[i * size : (i + 1) * size]),
                target_output[i * size : (i + 1) * size],
            )
        )
        for i in range(parts)
    ]


def one_step(strategy, batches, accumulation_steps=1, optimizer="sgd"):
    """Trains one step from fixed initial weights; returns (loss, weights)."""
    keras.utils.set_random_seed(7)
    with strategy.scope():
        model = kt.Transformer(
            30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2, dropout=0.0
        )
        model.build(((None, None), (None, None)))
        optimizer = keras.optimizers.SGD(0.5) if optimizer == "sgd" else keras.optimizers.Adam()
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    trainer = Trainer(model, optimizer, strategy, accumulation_steps=accumulation_steps)
    history = trainer.fit(dataset.repeat(), steps=1, verbose=0)
    assert int(optimizer.iterations.numpy()) == 1
    return history.history["loss"][0], [w.numpy() for w in model.trainable_weights]


def assert_same_step(reference, other):
    assert other[0] == pytest.approx(reference[0], rel=1e-5)
    for expected, actual in zip(reference[1], other[1], strict=True):
        np.testing.assert_allclose(actual, expected, atol=2e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def single_device_step():
    return one_step(tf.distribute.OneDeviceStrategy("/cpu:0"), [make_batch(0)])


def test_loss_is_the_token_mean_of_the_global_batch(single_device_step):
    keras.utils.set_random_seed(7)
    model = kt.Transformer(
        30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2, dropout=0.0
    )
    (source, target_input), target_output = make_batch(0)
    logits = model((source, target_input))
    expected = kt.LabelSmoothedCrossEntropy(0.1)(target_output, logits)
    assert single_device_step[0] == pytest.approx(float(expected), rel=1e-5)
    # A step on half the batch moves the weights elsewhere: the check has teeth.
    half = one_step(tf.distribute.OneDeviceStrategy("/cpu:0"), split(make_batch(0), 2)[:1])
    assert (
        max(np.max(np.abs(a - b)) for a, b in zip(half[1], single_device_step[1], strict=True))
        > 1e-3
    )


@needs_two_cpus
def test_mirrored_two_devices_equals_one_device(single_device_step):
    mirrored = make_strategy()[0]
    assert mirrored.num_replicas_in_sync == 2
    assert_same_step(single_device_step, one_step(mirrored, [make_batch(0)]))


@pytest.mark.parametrize("parts", [2, 4])
def test_accumulation_equals_one_large_batch(single_device_step, parts):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    micro = split(make_batch(0), parts)
    assert_same_step(single_device_step, one_step(strategy, micro, accumulation_steps=parts))


@needs_two_cpus
def test_accumulation_under_mirrored_strategy_equals_one_large_batch(single_device_step):
    mirrored = make_strategy()[0]
    micro = split(make_batch(0), 2)
    assert_same_step(single_device_step, one_step(mirrored, micro, accumulation_steps=2))


def test_adam_steps_and_callbacks_progress():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = kt.Transformer(30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2)
        model.build(((None, None), (None, None)))
        optimizer = keras.optimizers.Adam(1e-2)
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(logs))
    data = tf.data.Dataset.from_tensors(make_batch(1)).repeat()
    trainer = Trainer(model, optimizer, strategy)
    history = trainer.fit(
        data,
        steps=7,
        steps_per_epoch=3,
        callbacks=[record],
        validation_data=data.take(1),
        verbose=0,
    )
    assert int(optimizer.iterations.numpy()) == 7 and len(seen) == 7
    assert len(history.history["loss"]) == 3  # epochs of 3, 3 and 1 steps
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert set(history.history) >= {"accuracy", "learning_rate", "val_loss", "val_accuracy"}
    with pytest.raises(ValueError, match="accumulation_steps must be >= 1"):
        Trainer(model, optimizer, strategy, accumulation_steps=0)


@pytest.mark.parametrize("spent_minutes, epochs", [(0.0, 3), (10.0, 1)])
def test_time_budget_stops_after_the_last_epoch_that_fits(spent_minutes, epochs, tmp_path):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = kt.Transformer(30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2)
        model.build(((None, None), (None, None)))
        optimizer = keras.optimizers.Adam(1e-2)
    # A 10-minute budget with `spent_minutes` already gone before training began.
    budget = TimeBudget(10.0, started=time.perf_counter() - 60 * spent_minutes)
    checkpoints = keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch-{epoch}.keras"))
    data = tf.data.Dataset.from_tensors(make_batch(1)).repeat()
    history = Trainer(model, optimizer, strategy).fit(
        data, steps=6, steps_per_epoch=2, callbacks=[checkpoints, budget], verbose=0
    )
    assert len(history.history["loss"]) == epochs
    assert int(optimizer.iterations.numpy()) == 2 * epochs
    assert sorted(p.name for p in tmp_path.iterdir())[-1] == f"epoch-{epochs}.keras"
    assert budget.stopped_epoch == (0 if spent_minutes else None)
