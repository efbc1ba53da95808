import contextlib
import doctest

import jax
import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from pipelines.training import jax_trainer
from pipelines.training.jax_trainer import JaxTrainer
from tests.pipelines.training.shared import varied_examples
from tests.test_case import split_batch, token_batch

ONE = keras.distribution.DataParallel(devices=keras.distribution.list_devices()[:1])
TWO = keras.distribution.DataParallel(devices=keras.distribution.list_devices()[:2])


def test_two_cpu_devices_are_there():
    # `make test` sets XLA_FLAGS; without two devices the data-parallel checks prove nothing.
    assert len(jax.devices()) == 2


def test_docstring_examples():
    result = doctest.testmod(jax_trainer, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 8


def tiny_model(distribution=None, dropout=0.0):
    keras.utils.set_random_seed(7)
    with distribution.scope() if distribution else contextlib.nullcontext():
        model = kt.Transformer(
            30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2, dropout=dropout
        )
        model.build(((None, None), (None, None)))
    return model


def stream(batches):
    """The batches in order, repeated, as a tf.data dataset."""
    dataset = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        dataset = dataset.concatenate(tf.data.Dataset.from_tensors(batch))
    return dataset.repeat()


def one_step(batches, distribution=None, accumulation_steps=1, dropout=0.0):
    """Trains one step from fixed initial weights; returns (loss, weights)."""
    model = tiny_model(distribution, dropout)
    trainer = JaxTrainer(
        model, keras.optimizers.SGD(0.5), distribution, accumulation_steps=accumulation_steps
    )
    history = trainer.fit(stream(batches), steps=1, verbose=0)
    assert int(trainer.optimizer.iterations) == 1
    return history.history["loss"][0], [np.asarray(w) for w in model.trainable_weights]


def assert_same_step(reference, other):
    assert other[0] == pytest.approx(reference[0], rel=1e-5)
    for expected, actual in zip(reference[1], other[1], strict=True):
        np.testing.assert_allclose(actual, expected, atol=2e-6, rtol=1e-5)


@pytest.fixture(scope="module")
def single_device_step():
    return one_step([token_batch(0)])


def test_loss_is_the_token_mean_of_the_global_batch(single_device_step):
    (source, target_input), target_output = token_batch(0)
    logits = tiny_model()((source, target_input))
    expected = kt.LabelSmoothedCrossEntropy(0.1)(target_output, logits)
    assert single_device_step[0] == pytest.approx(float(expected), rel=1e-5)
    # A step on half the batch moves the weights elsewhere: the checks have teeth.
    half = one_step(split_batch(token_batch(0), 2)[:1])
    moved = [np.max(np.abs(a - b)) for a, b in zip(half[1], single_device_step[1], strict=True)]
    assert max(moved) > 1e-3


@pytest.mark.parametrize(
    "distribution, parts",
    [(TWO, 1), (ONE, 2), (None, 4), (TWO, 2)],
    ids=["2x1", "1x2", "1x4", "2x2"],
)
def test_devices_and_micro_batches_take_the_step_of_one_large_batch(
    single_device_step, distribution, parts
):
    batches = split_batch(token_batch(0), parts)
    assert_same_step(single_device_step, one_step(batches, distribution, parts))


def test_dropout_is_the_same_on_one_device_and_on_two():
    # JAX's partitionable random numbers: a mask does not depend on how the batch is split.
    one = one_step([token_batch(0)], ONE, dropout=0.3)
    assert_same_step(one, one_step([token_batch(0)], TWO, dropout=0.3))
    assert one[0] != pytest.approx(one_step([token_batch(0)], ONE)[0], rel=1e-4)


def test_a_schedule_changed_while_training_reaches_the_compiled_step():
    model = tiny_model()
    schedule = kt.TransformerSchedule(16, warmup_steps=2, cooldown=0.5)
    trainer = JaxTrainer(model, keras.optimizers.SGD(schedule), schedule=schedule)
    data = stream([token_batch(1)])
    trainer.fit(data, steps=2, verbose=0)
    before = [np.asarray(w) for w in model.trainable_weights]
    schedule.set_total_steps(2)  # the rate is 0 from step 2 on
    assert trainer.learning_rate() == 0.0
    trainer.fit(data, steps=3, verbose=0)
    assert int(trainer.optimizer.iterations) == 3
    for expected, actual in zip(before, model.trainable_weights, strict=True):
        np.testing.assert_array_equal(np.asarray(actual), expected)


def test_adam_steps_callbacks_validation_and_checkpoints(tmp_path):
    model = tiny_model(TWO, dropout=0.1)
    trainer = JaxTrainer(model, keras.optimizers.Adam(1e-2), TWO)
    seen = []
    record = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: seen.append(logs))
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch-{epoch}.keras"))
    data = stream([token_batch(1)])
    history = trainer.fit(
        data,
        steps=7,
        steps_per_epoch=3,
        callbacks=[record, checkpoint],
        validation_data=data.take(1),
        verbose=0,
    )
    assert int(trainer.optimizer.iterations) == 7 and len(seen) == 7
    assert len(history.history["loss"]) == 3  # epochs of 3, 3 and 1 steps
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert set(history.history) >= {"accuracy", "learning_rate", "val_loss", "val_accuracy"}
    # The variables hold the trained state: the last checkpoint has the model's weights.
    saved = keras.saving.load_model(str(tmp_path / "epoch-3.keras"))
    for expected, actual in zip(model.get_weights(), saved.get_weights(), strict=True):
        np.testing.assert_array_equal(actual, expected)
    assert int(saved.optimizer.iterations) == 7
    # Evaluation is the label-smoothed token mean of the model's own outputs.
    (source, target_input), target_output = token_batch(1)
    expected = kt.LabelSmoothedCrossEntropy(0.1)(target_output, model((source, target_input)))
    assert trainer.evaluate(data.take(1))["loss"] == pytest.approx(float(expected), rel=1e-5)


def test_a_mixed_bfloat16_step_is_the_float32_step_to_bfloat16_precision(single_device_step):
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        mixed = one_step([token_batch(0)], TWO)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert mixed[0] == pytest.approx(single_device_step[0], rel=1e-2)
    for expected, actual in zip(single_device_step[1], mixed[1], strict=True):
        assert actual.dtype == np.float32  # float32 weights, bfloat16 arithmetic
        np.testing.assert_allclose(actual, expected, atol=2e-2)


def test_a_late_resume_restores_the_stream_and_trains_on_the_same_batches(tmp_path):
    from pipelines.data.batching import batch_examples
    from pipelines.training.backup import RunBackup

    examples = varied_examples()

    class Interrupt(Exception):
        pass

    def interrupt(epoch, logs):
        if epoch == 5:
            raise Interrupt

    def train(backup, extra=()):
        model = tiny_model(TWO)
        trainer = JaxTrainer(model, keras.optimizers.Adam(1e-2), TWO)
        # Shuffled, repeated, several batch shapes, built anew as in a new process:
        # step 18 is in the third pass.
        data = batch_examples(
            examples, 40, 12, repeat=True, seed=5, fixed_shapes=True, row_multiple=2
        )
        backup = RunBackup(str(backup), every=3)
        trainer.fit(data, steps=24, steps_per_epoch=3, callbacks=extra, backup=backup, verbose=0)
        return trainer, [np.asarray(w) for w in model.trainable_weights]

    _, uninterrupted = train(tmp_path / "a")
    with pytest.raises(Interrupt):
        train(tmp_path / "b", [keras.callbacks.LambdaCallback(on_epoch_end=interrupt)])
    resumed, weights = train(tmp_path / "b")
    assert resumed.initial_step == 15  # step 18 ends the epoch the kill interrupted
    for expected, actual in zip(uninterrupted, weights, strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_the_logged_gradient_norm_is_the_norm_of_the_update_sgd_took():
    model = tiny_model(TWO)
    trainer = JaxTrainer(model, keras.optimizers.SGD(0.5), TWO)
    before = model.get_weights()
    history = trainer.fit(stream([token_batch(0)]), steps=1, verbose=0)
    moved = [(a - b).ravel() for a, b in zip(model.get_weights(), before, strict=True)]
    expected = np.linalg.norm(np.concatenate(moved)) / 0.5  # SGD's step is rate times gradient
    assert history.history["gradient_norm"][0] == pytest.approx(expected, rel=1e-4)


def test_ema_weights_are_the_moving_average_of_each_step():
    model = tiny_model(TWO)
    trainer = JaxTrainer(model, keras.optimizers.Adam(1e-2, use_ema=True, ema_momentum=0.5), TWO)
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(model.get_weights())
    )
    batches = [token_batch(i) for i in range(3)]
    trainer.fit(stream(batches), steps=4, steps_per_epoch=4, callbacks=[record], verbose=0)
    average = seen[0]  # the first step's weights start the average
    for weights in seen[1:]:
        average = [0.5 * a + 0.5 * w for a, w in zip(average, weights, strict=True)]
    trained = model.get_weights()
    with trainer.ema_weights():
        for expected, actual in zip(average, model.get_weights(), strict=True):
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    for expected, actual in zip(trained, model.get_weights(), strict=True):
        np.testing.assert_array_equal(actual, expected)


def test_refusals():
    model = tiny_model(TWO)
    trainer = JaxTrainer(model, keras.optimizers.SGD(0.1), TWO)
    odd = split_batch(token_batch(0), 8)[0]  # one row: cannot split over two devices
    with pytest.raises(ValueError, match="A batch of 1 rows does not split over 2 devices"):
        trainer.fit(stream([odd]), steps=1, verbose=0)
    once = tf.data.Dataset.from_tensors(token_batch(0))
    with pytest.raises(ValueError, match="ran out of batches before the last step: repeat it"):
        trainer.fit(once, steps=2, verbose=0)
    assert int(trainer.optimizer.iterations) == 1 and all(  # the state is whole
        np.all(np.isfinite(np.asarray(v))) for v in model.trainable_variables
    )
    with pytest.raises(ValueError, match="accumulation_steps must be >= 1"):
        JaxTrainer(model, keras.optimizers.SGD(0.1), accumulation_steps=0)
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="mixed_bfloat16"):
        JaxTrainer(model, scaled)
