"""Fitting a run to a wall-clock budget (`TimeBudget`), on one clock for every worker.

The budget sets the run's length from the measured step time, so the
schedule's cooldown ends where the minutes do; `budget_clock` reads the same
time on every MultiWorkerMirroredStrategy worker.
"""

import json
import logging
import math
import os
import statistics
import time

import keras
import tensorflow as tf

from pipelines.files import write_json
from pipelines.training.loop import optimizer_steps

logger = logging.getLogger(__name__)


class TimeBudget(keras.callbacks.Callback):
    """Fits a run to a wall-clock budget: sets its length and ends it there.

    At the end of every epoch the callback measures the time a step takes
    (an epoch's training, validation and checkpoint over its steps; the
    median of the last three epochs, leaving out the first, which includes
    tracing, once others exist; the first is timed from the end of its first
    batch, so tracing does not cut the first plan short), counts the steps
    that still fit before `minutes` minus `reserve_minutes` (kept for
    averaging and evaluation after training), and plans the run to end after
    them, mid-epoch if need be (that epoch is
    validated and checkpointed as it ends). It sets the schedule's
    `total_steps`, so a cooldown ends at the end of the budget, and stops
    training when the plan is done. Before the cooldown begins a new plan
    moves the cooldown with it (a plan that shrinks lowers the rate at once).
    Once the rate has begun to fall, a new plan keeps it where it is and
    moves the end of its fall: steps that speed up late lengthen the fall,
    so the budget is spent, and steps that slow down steepen it (the rate
    never rises again and still ends at 0).
    A step that ends past the training
    time (`minutes - reserve_minutes`) ends the plan there, mid-epoch, so a
    sudden slowdown costs at most one step and the epoch's validation. The
    plan is written to `plan_path` with `minutes`; a resumed run keeps it
    (shrinking it only if its own budget runs out first). A finished run
    (its plan done, `max_steps` not reached) given more `minutes` than its
    plan records trains on for the difference: planned at once from the
    plan's step time (and re-planned at epoch ends), the rate rises back to
    eq. (3)'s and falls to 0 again by the new end (linearly from eq. (3)'s,
    where the plain fall would have begun before the extension).
    As training ends, the plan also
    records its clock (seconds since `started`, in this process) at the end
    of the last epoch, its validation and checkpoint included
    (`trained_seconds`; also the attribute of that name): the time the
    budget governs, apart from what callbacks and the process do after.
    An epoch's logs, as the history and the callbacks after this one see
    them, hold the rate as its plan left it.

    Args:
        minutes: float, the budget, counted from `started`.
        started: float or None, a `clock()` reading; defaults to when
            training begins.
        reserve_minutes: float, part of the budget kept for after training.
        schedule: a `TransformerSchedule` with `cooldown > 0`, or None to
            only stop.
        max_steps: int or None, the longest plan allowed.
        plan_path: str or None, a JSON file for the plan.
        clock: function returning seconds, `time.perf_counter` by default.
        progbar: a `keras.callbacks.ProgbarLogger` of the same fit, or None:
            its epoch count follows the plan.
    """

    def __init__(
        self,
        minutes,
        started=None,
        reserve_minutes=0.0,
        schedule=None,
        max_steps=None,
        plan_path=None,
        clock=time.perf_counter,
        progbar=None,
    ):
        super().__init__()
        self.minutes = minutes
        self.granted = minutes  # recorded in the plan; a resume keeps the plan's
        self.seconds = 60.0 * minutes
        self.reserve = 60.0 * reserve_minutes
        self.started = started
        self.schedule = schedule
        self.max_steps = max_steps
        self.plan_path = plan_path
        self.total_steps = None
        self.stopped_epoch = None
        self.resumed = False
        self.clock = clock
        self.progbar = progbar
        self.trained_seconds = None
        self.extended_from = None
        self._durations = []

    def _step(self):
        return optimizer_steps(self.model.optimizer)

    def _cooling(self):
        """Whether the rate has begun its fall (or a re-planned fall is set)."""
        if self.schedule is None or self.schedule.cooldown_from is not None:
            return self.schedule is not None
        return self.schedule.multiplier(self._step()) < 1.0

    def on_train_begin(self, logs=None):
        if self.started is None:
            self.started = self.clock()
        self._last = self.clock()
        step = self._step()
        if self.plan_path and step > 0 and os.path.exists(self.plan_path):
            with open(self.plan_path, encoding="utf-8") as handle:
                plan = json.load(handle)
            granted = plan.get("minutes")
            done = step >= plan["total_steps"]
            capped = self.max_steps is not None and step >= self.max_steps
            if done and not capped and granted is not None and self.minutes > granted:
                if self._extend(step, granted, plan.get("step_seconds")):
                    return
            self.granted = granted if granted is not None else self.minutes
            self._set_plan(plan["total_steps"], plan.get("cooldown_from"))
            self.resumed = True
            logger.info("Resuming the time budget's plan of %d steps", self.total_steps)
            if step >= self.total_steps:
                self.model.stop_training = True  # done: not one step more

    def _extend(self, step, granted, step_seconds):
        """Plans a finished run's steps in the minutes beyond the `granted` ones.

        Returns:
            bool, whether a step fits them (by the plan's step time, where known).
        """
        seconds = 60.0 * (self.minutes - granted)
        left = seconds - self.reserve - (self.clock() - self.started)
        fits = int(left // step_seconds) if step_seconds else None
        if fits is not None and fits < 1:
            logger.info("Time budget: %.1f more minutes fit no step", self.minutes - granted)
            return False
        self.seconds, self.extended_from = seconds, step
        if self.schedule is not None:
            self.schedule.set_total_steps(0)  # the finished fall dropped: eq. (3) from here
        logger.info(
            "Time budget: the finished run of %d steps goes on for %.1f more minutes (%.1f in all)",
            step,
            self.minutes - granted,
            self.minutes,
        )
        if fits is not None:  # planned at once, so a short extension still falls to 0
            self._set_plan(step + fits)
            self._write_plan(step + fits, step_seconds)
        return True

    def _set_plan(self, total_steps, cooldown_from=None):
        """Plans `total_steps`; `cooldown_from` restores a resumed plan's fall."""
        if self.schedule is not None:
            step = self._step()
            if cooldown_from is None and self._cooling():  # the fall goes on from here
                cooldown_from = (step, self.schedule.multiplier(step))
            elif cooldown_from is None and self.extended_from is not None:
                if total_steps - self.schedule.cooldown * total_steps < step:
                    cooldown_from = (step, 1.0)  # an extension's fall, without a jump
            self.schedule.set_total_steps(total_steps, cooldown_from)
        self.total_steps = total_steps
        if self.progbar is not None:  # "Epoch 3/37", not the step cap's count
            self.progbar.epochs = math.ceil(total_steps / self.params["steps"])

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_first_step = self._step()

    def on_train_batch_end(self, batch, logs=None):
        step = self._step()
        if not self._durations and batch == 0:
            # The fit's first batch also traced the train function: the first
            # epoch is timed from here, so the first plan is not cut short.
            self._last = self.clock()
            self._epoch_first_step = step
        if (self.total_steps is None or step < self.total_steps) and self._past_deadline():
            # Steps slowed down inside an epoch (a plan is revised only at
            # an epoch's end): the plan ends here, so the rate falls to 0 now.
            logger.info("Time budget: out of training time, %d steps in all", step)
            self._set_plan(step)
            self._write_plan(step, None)
        if self.total_steps is not None and step >= self.total_steps:
            self.model.stop_training = True

    def _past_deadline(self):
        return self.clock() - self.started >= self.seconds - self.reserve

    def _write_plan(self, total_steps, step_seconds):
        if self.plan_path:
            fall = self.schedule.cooldown_from if self.schedule is not None else None
            plan = {"total_steps": total_steps, "step_seconds": step_seconds}
            plan["minutes"] = self.granted
            write_json(self.plan_path, {**plan, "cooldown_from": fall})

    def on_epoch_end(self, epoch, logs=None):
        now = self.clock()
        self.trained_seconds = now - self.started
        step = self._step()
        self._durations.append((now - self._last) / max(step - self._epoch_first_step, 1))
        self._last = now
        # The first epoch also traced the train function: left out once others exist.
        step_seconds = statistics.median(self._durations[1:][-3:] or self._durations)
        left = self.seconds - self.reserve - (now - self.started)
        planned = step + max(int(left // step_seconds), 0)
        if self.max_steps:
            planned = min(planned, self.max_steps)
        fixed = self.resumed  # the plan may only shrink
        done = self.total_steps is not None and step >= self.total_steps  # stopping already
        if (
            not done
            and planned != self.total_steps
            and (self.total_steps is None or not fixed or planned < self.total_steps)
        ):
            logger.info(
                "Time budget: %d steps in all (%d more; %.3f s a step, %.1f minutes left)",
                planned,
                planned - step,
                step_seconds,
                left / 60,
            )
            self._set_plan(planned)
            self._write_plan(planned, step_seconds)
        if logs is not None and "learning_rate" in logs and self.schedule is not None:
            # The epoch's logs read the rate before this plan (or one set at a
            # deadline inside the epoch) moved it; the history keeps this one,
            # as `keras.callbacks.LearningRateScheduler` does.
            logs["learning_rate"] = float(
                keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)
            )
        if step >= self.total_steps:
            logger.info(
                "Time budget of %.1f minutes: done after epoch %d", self.seconds / 60, epoch + 1
            )
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs=None):
        if self.trained_seconds is not None and self.plan_path and os.path.exists(self.plan_path):
            with open(self.plan_path, encoding="utf-8") as handle:
                plan = json.load(handle)
            write_json(self.plan_path, {**plan, "trained_seconds": round(self.trained_seconds, 1)})


def budget_clock(strategy, started, clock=time.perf_counter):
    """Seconds since the run started, as a `TimeBudget` clock: the same on every worker.

    Under MultiWorkerMirroredStrategy each worker starts at its own time;
    timed on its own clock, each would plan its own number of steps, and the
    first to stop would leave the others waiting in their next all-reduce.
    There a reading is the longest any worker has run since its `started`
    (an all-gather over the replicas, then the maximum), so all workers take
    the same decisions at the same steps; every worker must read it at the
    same points, as `TimeBudget` does. Other strategies read `clock` alone.
    Pass it with `TimeBudget(started=0.0)`.

    Args:
        strategy: the run's `tf.distribute.Strategy`.
        started: float, this worker's `clock()` reading at its start.
        clock: function returning seconds, `time.perf_counter` by default.

    Returns:
        function of no arguments returning float seconds.
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return lambda: clock() - started

    @tf.function
    def longest(seconds):  # (1,) float64 -> () float64
        def gather():
            # The identity places the value on the replica's device: the
            # gather has no destination for a tensor captured from outside.
            mine = tf.identity(seconds)
            return tf.distribute.get_replica_context().all_gather(mine, axis=0)

        gathered = strategy.run(gather)  # (replicas,) on every replica
        return tf.reduce_max(strategy.experimental_local_results(gathered)[0])

    return lambda: float(longest(tf.constant([clock() - started], tf.float64)))
