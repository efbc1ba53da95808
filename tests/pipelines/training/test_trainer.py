import json
import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from pipelines.training.budget import TimeBudget
from pipelines.training.parallel import make_strategy
from pipelines.training.streams import TensorStream
from pipelines.training.trainer import Trainer
from tests.pipelines.conftest import two_cpus
from tests.pipelines.training.shared import varied_examples
from tests.test_case import split_batch, token_batch

# Mirrored tests share the process's one strategy (see make_strategy).
needs_two_cpus = pytest.mark.skipif(not two_cpus(), reason="needs 2 logical CPU devices")


def make_batch(seed):
    return tf.nest.map_structure(tf.constant, token_batch(seed))


def split(batch, parts):
    return split_batch(batch, parts)


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


def tiny_model_and_optimizer(strategy, optimizer=None, seed=3):
    keras.utils.set_random_seed(seed)
    with strategy.scope():
        model = kt.Transformer(
            30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2, dropout=0.0
        )
        model.build(((None, None), (None, None)))
        optimizer = optimizer() if optimizer else keras.optimizers.Adam(1e-2)
    return model, optimizer


@pytest.mark.parametrize("spent_minutes, epochs, steps", [(0.0, 3, 6), (10.0, 1, 1)])
def test_time_budget_stops_after_the_last_epoch_that_fits(spent_minutes, epochs, steps, tmp_path):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    model, optimizer = tiny_model_and_optimizer(strategy)
    # A 10-minute budget with `spent_minutes` already gone before training began:
    # a spent budget ends the plan at its first step, and that epoch is saved.
    budget = TimeBudget(10.0, started=time.perf_counter() - 60 * spent_minutes)
    checkpoints = keras.callbacks.ModelCheckpoint(str(tmp_path / "epoch-{epoch}.keras"))
    data = tf.data.Dataset.from_tensors(make_batch(1)).repeat()
    history = Trainer(model, optimizer, strategy).fit(
        data, steps=6, steps_per_epoch=2, callbacks=[checkpoints, budget], verbose=0
    )
    assert len(history.history["loss"]) == epochs
    assert int(optimizer.iterations.numpy()) == steps
    assert sorted(p.name for p in tmp_path.iterdir())[-1] == f"epoch-{epochs}.keras"
    assert budget.stopped_epoch == (0 if spent_minutes else None)


class FakeClock:
    """A clock for `TimeBudget` on which each training step takes `step_seconds`."""

    def __init__(self, step_seconds):
        self.now = 1000.0
        self.step_seconds = step_seconds

    def __call__(self):
        return self.now

    def tick(self):
        self.now += self.step_seconds


def cooled_trainer():
    """`(trainer, schedule)`: a tiny model trained on eq. (3) with a cooldown over half the run."""
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    schedule = kt.TransformerSchedule(16, warmup_steps=2, cooldown=0.5)
    model, optimizer = tiny_model_and_optimizer(
        strategy, lambda: kt.transformer_optimizer(16, schedule=schedule)
    )
    return Trainer(model, optimizer, strategy), schedule


def planned_run(step_seconds, tmp_path, minutes=3.0):
    """`(clock, trainer, schedule, plan, budget)`: a cooled run under a budget kept in `plan`."""
    clock = FakeClock(step_seconds)
    trainer, schedule = cooled_trainer()
    plan = tmp_path / "budget.json"
    budget = TimeBudget(minutes, clock(), 0.0, schedule, plan_path=str(plan), clock=clock)
    return clock, trainer, schedule, plan, budget


def fit_by_the_clock(trainer, budget, on_batch_end, steps_per_epoch):
    """Fits `trainer` on one repeated batch under `budget`; `on_batch_end` moves the clock.

    Returns the fit's `keras.callbacks.History`."""
    data = tf.data.Dataset.from_tensors(make_batch(1)).repeat()
    return trainer.fit(
        data,
        steps=1000,
        steps_per_epoch=steps_per_epoch,
        callbacks=[keras.callbacks.LambdaCallback(on_train_batch_end=on_batch_end), budget],
        verbose=0,
    )


def test_time_budget_sets_the_run_length_and_the_cooldown_ends_with_it(tmp_path):
    clock = FakeClock(step_seconds=6.0)
    trainer, schedule = cooled_trainer()
    # 3 minutes, 0.5 kept for after training, steps of 6 s: 25 steps fit, so
    # the run ends 1 step into its 7th epoch of 4 steps.
    plan = tmp_path / "budget.json"
    progbar = keras.callbacks.ProgbarLogger()
    budget = TimeBudget(3.0, clock(), 0.5, schedule, plan_path=str(plan), clock=clock,
                        progbar=progbar)  # fmt: skip
    rates = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: (clock.tick(), rates.append(logs["learning_rate"]))
    )
    data = tf.data.Dataset.from_tensors(make_batch(1)).repeat()
    history = trainer.fit(
        data, steps=1000, steps_per_epoch=4, callbacks=[record, progbar, budget], verbose=0
    )
    assert int(trainer.optimizer.iterations.numpy()) == 25 == schedule.total_steps
    assert len(history.history["loss"]) == 7 and budget.stopped_epoch == 6
    assert progbar.epochs == 7  # the progress bar counts the planned epochs, not 250
    assert clock.now - 1000.0 <= (3.0 - 0.5) * 60
    assert json.loads(plan.read_text())["total_steps"] == 25
    # The plan also keeps the time training took by the budget's clock: 25 steps of 6 s.
    assert budget.trained_seconds == 150.0 == json.loads(plan.read_text())["trained_seconds"]
    # The schedule reaches its final value, 0, at the end of the budget; the
    # rate logged after update i is the rate of update i + 1: eq. (3) times
    # (25 - i - 1) / 12.5 over the last half.
    assert float(schedule(25)) == 0.0 and rates[-1] == 0.0
    paper = kt.TransformerSchedule(16, 2)
    for i in range(25):
        factor = min(1.0, (25 - i - 1) / 12.5)
        np.testing.assert_allclose(rates[i], float(paper(i + 1)) * factor, rtol=1e-5, atol=1e-9)


def test_a_slower_epoch_shrinks_the_plan_within_the_budget(tmp_path):
    clock = FakeClock(step_seconds=6.0)
    trainer, schedule = cooled_trainer()
    optimizer = trainer.optimizer
    budget = TimeBudget(3.0, clock(), 0.0, schedule, clock=clock)

    def slow_down(batch, logs):
        clock.tick()
        if int(optimizer.iterations.numpy()) >= 8:  # steps take 10 s from the 5th epoch on
            clock.step_seconds = 10.0

    fit_by_the_clock(trainer, budget, slow_down, steps_per_epoch=2)
    steps = int(optimizer.iterations.numpy())
    assert clock.now - 1000.0 <= 180.0 and steps == schedule.total_steps < 30
    assert float(schedule(steps)) == 0.0


def test_the_first_plan_leaves_out_the_first_batch_which_traces(tmp_path):
    # The fit's first batch takes 100 s (tracing), every other 6 s; 5 minutes.
    # Timed from the first batch's end, epoch 1 says 6 s a step: 4 + 30 steps
    # fit. Timed from its start it would say 29.5 s and plan 10 steps, with
    # the cooldown starting at step 5.
    clock = FakeClock(step_seconds=100.0)
    trainer, schedule = cooled_trainer()
    budget = TimeBudget(5.0, clock(), 0.0, schedule, clock=clock)

    def tick(batch, logs):
        clock.tick()
        clock.step_seconds = 6.0

    fit_by_the_clock(trainer, budget, tick, steps_per_epoch=4)
    assert int(trainer.optimizer.iterations.numpy()) == 34 == schedule.total_steps
    assert clock.now - 1000.0 <= 300.0


@pytest.mark.parametrize("steps_per_epoch", [2, 5])
def test_steps_that_speed_up_in_the_cooldown_lengthen_its_fall(steps_per_epoch, tmp_path):
    # 3 minutes, steps of 10 s: 18 steps fit, the cooldown starts at step 9.
    # From step 12 on steps take 5 s: the plan grows to spend the budget, and
    # the rate falls on from where it is instead of rising again.
    clock, trainer, schedule, plan, budget = planned_run(10.0, tmp_path)
    optimizer = trainer.optimizer
    rates = []

    def speed_up(batch, logs):
        clock.tick()
        rates.append(logs["learning_rate"])
        if int(optimizer.iterations.numpy()) >= 12:
            clock.step_seconds = 5.0

    # With epochs of 5 the plan ends mid-epoch, and the epoch's end must not
    # lengthen a plan already done.
    fit_by_the_clock(trainer, budget, speed_up, steps_per_epoch=steps_per_epoch)
    steps = int(optimizer.iterations.numpy())
    # 12 steps of 10 s, then the rest of the 180 s at 5 s a step (the first
    # faster epoch still says 10 s: the plan follows the median of three).
    assert 18 < steps == schedule.total_steps and clock.now - 1000.0 <= 180.0
    # The budget is spent, up to an epoch's steps (a plan is revised at epoch ends).
    assert 180.0 - clock.now + 1000.0 < steps_per_epoch * 10.0
    saved = json.loads(plan.read_text())
    assert saved["total_steps"] == steps and saved["cooldown_from"][0] > 9
    # From the cooldown's start the rate only falls, and it ends at 0.
    assert np.all(np.diff(rates[8:]) <= 0) and rates[-1] == 0.0
    # The last re-plan's fall: linear from its multiplier to 0 at the end.
    start, multiplier = schedule.cooldown_from
    paper = kt.TransformerSchedule(16, 2)
    for i in range(start, steps):
        factor = multiplier * (steps - i) / (steps - start)
        np.testing.assert_allclose(float(schedule(i)), float(paper(i)) * factor, rtol=1e-5)


def test_a_resumed_plan_keeps_its_replanned_fall(tmp_path):
    # The plan was re-planned at step 20 (multiplier 0.5, end 40); the run
    # resumes from a backup at step 15, before the re-plan.
    _, trainer, schedule, plan, budget = planned_run(6.0, tmp_path)
    saved = {"total_steps": 40, "step_seconds": 6.0, "cooldown_from": [20, 0.5]}
    plan.write_text(json.dumps(saved))
    trainer.optimizer.iterations.assign(15)
    budget.set_model(trainer.model)
    budget.on_train_begin()
    assert budget.resumed and budget.total_steps == schedule.total_steps == 40
    assert schedule.cooldown_from == (20, 0.5)
    multipliers = np.array([schedule.multiplier(i) for i in range(15, 41)])
    # The line from (20, 0.5) to (40, 0), also before 20: no rise, no jump.
    np.testing.assert_allclose(multipliers, 0.5 * (40 - np.arange(15, 41)) / 20, rtol=1e-6)


def test_a_finished_budgeted_run_given_more_minutes_goes_on_and_falls_to_zero_again(tmp_path):
    # 3 minutes at 6 s a step: 30 steps, the rate 0 at the end.
    clock, trainer, schedule, plan, budget = planned_run(6.0, tmp_path)
    optimizer = trainer.optimizer
    fit_by_the_clock(trainer, budget, lambda batch, logs: clock.tick(), steps_per_epoch=4)
    finished = int(optimizer.iterations.numpy())
    assert finished == 30 and json.loads(plan.read_text())["minutes"] == 3.0
    assert float(optimizer.learning_rate) == 0.0

    def rerun(minutes, max_steps=None):
        clock.now = 1000.0  # a new process's clock
        rates = []

        def tick(batch, logs):
            clock.tick()
            rates.append(float(optimizer.learning_rate))

        again = TimeBudget(minutes, clock(), 0.0, schedule, max_steps=max_steps,
                           plan_path=str(plan), clock=clock)  # fmt: skip
        fit_by_the_clock(trainer, again, tick, steps_per_epoch=4)
        return again, rates

    # The same budget again: the run is done, nothing more is trained.
    same, _ = rerun(3.0)
    assert same.resumed and int(optimizer.iterations.numpy()) == finished
    # More minutes, but the run's step cap is reached: done too.
    capped, _ = rerun(5.0, max_steps=finished)
    assert capped.extended_from is None and int(optimizer.iterations.numpy()) == finished
    # Two minutes more: 20 more steps, the rate back up, then down to 0 by the new end.
    more, rates = rerun(5.0)
    steps = int(optimizer.iterations.numpy())
    assert more.extended_from == finished and steps - finished == 20
    assert rates[0] > 0 and rates[-1] == 0.0
    paper = kt.TransformerSchedule(16, 2)
    # Planned at once (the plan's 6 s a step): the plain fall over the last half of 50
    # steps would have begun at 25, so the rate falls from eq. (3)'s at 30 to 0 at 50.
    assert rates[0] == pytest.approx(float(paper(finished + 1)) * 19 / 20, rel=1e-5)
    assert np.all(np.diff(rates) <= 0)
    saved = json.loads(plan.read_text())
    assert saved["total_steps"] == steps and saved["minutes"] == 5.0
    # Rerun with the same 5 minutes: done again.
    rerun(5.0)
    assert int(optimizer.iterations.numpy()) == steps


def test_a_step_past_the_deadline_ends_the_plan_mid_epoch(tmp_path):
    # 3 minutes; steps take 6 s, then 30 s from the 11th on, inside an epoch
    # of 8 steps, before the plan can be revised at its end.
    clock, trainer, schedule, plan, budget = planned_run(6.0, tmp_path)
    optimizer = trainer.optimizer

    def slow_down(batch, logs):
        clock.tick()
        if int(optimizer.iterations.numpy()) >= 10:
            clock.step_seconds = 30.0

    history = fit_by_the_clock(trainer, budget, slow_down, steps_per_epoch=8)
    steps = int(optimizer.iterations.numpy())
    # The step that crossed 180 s is the last: at most one step past it.
    assert 180.0 <= clock.now - 1000.0 < 180.0 + 30.0
    assert steps == schedule.total_steps == json.loads(plan.read_text())["total_steps"]
    assert float(schedule(steps)) == 0.0
    # The last epoch's logs hold the rate the plan ended at, not the one its last step read.
    rates = history.history["learning_rate"]
    assert rates[-1] == 0.0 and min(rates[:-1]) > 0.0


def test_a_first_epoch_longer_than_the_budget_ends_at_the_deadline(tmp_path):
    # 3 minutes, steps of 100 s, epochs of 8: no plan exists before the first
    # epoch ends, and the step that crosses 180 s ends the run.
    clock = FakeClock(step_seconds=100.0)
    trainer, schedule = cooled_trainer()
    budget = TimeBudget(3.0, clock(), 0.0, schedule, clock=clock)
    fit_by_the_clock(trainer, budget, lambda batch, logs: clock.tick(), steps_per_epoch=8)
    steps = int(trainer.optimizer.iterations.numpy())
    assert clock.now - 1000.0 == 200.0 and steps == 2 == schedule.total_steps
    assert float(schedule(steps)) == 0.0


class Interrupt(Exception):
    pass


def interrupt_at_epoch(epoch_index):
    """A callback that raises `Interrupt` as epoch `epoch_index` ends (a kill, in-process)."""

    def interrupt(epoch, logs):
        if epoch == epoch_index:
            raise Interrupt

    return keras.callbacks.LambdaCallback(on_epoch_end=interrupt)


def test_a_late_resume_restores_the_stream_and_trains_on_the_same_batches(tmp_path, monkeypatch):
    from pipelines.data.batching import batch_examples
    from pipelines.training.backup import RunBackup
    from pipelines.training.callbacks import ResumableEarlyStopping

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    examples = varied_examples()

    def train(backup_dir, extra=()):
        model, optimizer = tiny_model_and_optimizer(strategy)
        trainer = Trainer(model, optimizer, strategy)
        # Shuffled, repeated, several batch shapes, built anew as in a new process:
        # about 12 batches a pass, so step 24 is late in the third pass.
        data = batch_examples(examples, batch_tokens=40, max_length=12, repeat=True, seed=5)
        stopping = ResumableEarlyStopping("loss", patience=100)
        history = trainer.fit(
            data,
            steps=30,
            steps_per_epoch=3,
            callbacks=[stopping, *extra],
            backup=RunBackup(str(backup_dir), every=3),
            verbose=0,
        )
        return trainer, [w.numpy() for w in model.trainable_weights], stopping, history

    _, uninterrupted, stopping, _ = train(tmp_path / "a")
    with pytest.raises(Interrupt):
        train(tmp_path / "b", [interrupt_at_epoch(7)])
    # One backup, the newest: step 24 ends an epoch, so it is backed up after the epoch's
    # callbacks, which the kill interrupted.
    assert os.listdir(tmp_path / "b") == ["step-000000021"]

    def no_skipping(stream, count):
        raise AssertionError(f"the restored stream read past {count} batches")

    monkeypatch.setattr(TensorStream, "skip", no_skipping)
    resumed, weights, resumed_stopping, history = train(tmp_path / "b")
    assert resumed.initial_step == 21
    for expected, actual in zip(uninterrupted, weights, strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
    # Early stopping counted over the whole run: the same best and wait as without the kill.
    assert len(history.history["loss"]) == 3  # the interrupted epoch again, then two
    assert resumed_stopping.get_state() == stopping.get_state()


def test_a_run_restored_by_keras_backup_reads_past_the_restored_steps(tmp_path):
    from pipelines.data.batching import batch_examples

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    examples = varied_examples()

    def train(steps, backup, extra=()):
        model, optimizer = tiny_model_and_optimizer(strategy)
        trainer = Trainer(model, optimizer, strategy)
        data = batch_examples(examples, batch_tokens=40, max_length=12, repeat=True, seed=5)
        callbacks = [keras.callbacks.BackupAndRestore(str(backup)), *extra]
        trainer.fit(data, steps=steps, steps_per_epoch=3, callbacks=callbacks, verbose=0)
        return trainer, [w.numpy() for w in model.trainable_weights]

    _, uninterrupted = train(9, tmp_path / "a")
    with pytest.raises(Interrupt):
        train(9, tmp_path / "b", [interrupt_at_epoch(1)])
    resumed, weights = train(9, tmp_path / "b")
    assert resumed.initial_step == 6
    for expected, actual in zip(uninterrupted, weights, strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)
