"""Training under tf.distribute with token-exact losses and gradient accumulation.

`keras.Model.fit` cannot do two things this product needs (TensorFlow 2.21,
Keras 3.15): under MultiWorkerMirroredStrategy it fails before the first step,
because it reduces a batch of ids across workers to build the model
symbolically (keras-team/keras#20585); and the optimizer's
`gradient_accumulation_steps` puts an all-reduce inside a `cond`, which
MirroredStrategy rejects. `Trainer` owns the train function instead and keeps
Keras callbacks (progress bar, checkpoints, TensorBoard, TerminateOnNaN,
EarlyStopping) driving it the way `fit` does, and saves the whole training
state, the input stream's position included, in a `RunBackup`.

Each step sums the label-smoothed loss and the token count over every replica
and micro-batch and divides once, so the update equals one step on the whole
global batch: the same on one device, on N replicas, or over k accumulated
micro-batches. Accumulation runs k-1 collective-free functions that add
gradients to replica-local variables, then one function that all-reduces and
applies: no collective ever sits inside a conditional.
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
from pipelines.training.loop import TrainingLoop, optimizer_steps, token_metrics
from pipelines.training.streams import TensorStream

logger = logging.getLogger(__name__)

# With several replicas the gradient's norm is measured on this process's first step and
# every NORM_EVERY steps (TensorBoard's `update_freq` in `kt train`).
NORM_EVERY = 50


def _correct_tokens(labels, logits, pad_id):
    predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
    real = tf.not_equal(labels, pad_id)
    return tf.reduce_sum(tf.cast(tf.logical_and(real, tf.equal(predictions, labels)), tf.float32))


class Trainer(TrainingLoop):
    """Trains a `Transformer` on a tf.data dataset under a distribution strategy.

    Create the model and the optimizer inside `strategy.scope()`, then hand
    them to the trainer. The trainer compiles the model with the optimizer (so
    checkpoints and callbacks find it) and trains by optimizer steps: `fit`
    stops after `steps` updates in total, counting those restored from its
    `backup`, so a resumed run ends where an uninterrupted one would.

    Args:
        model: a built `Transformer`.
        optimizer: a Keras optimizer created under the strategy's scope.
        strategy: `tf.distribute.Strategy` or None for the current one.
        label_smoothing: float, section 5.4.
        accumulation_steps: int, micro-batches per optimizer step.
        jit_compile: bool, compile each step with XLA (one compilation per
            distinct batch shape).

    Example:
    >>> import keras_transformer as kt
    >>> model = kt.Transformer(50, num_layers=1, hidden_dim=8, intermediate_dim=16, num_heads=2)
    >>> model.build(((None, None), (None, None)))
    >>> trainer = Trainer(model, keras.optimizers.Adam(1e-3))
    >>> source = tf.constant([[5, 6, 3]]); target = tf.constant([[2, 5, 6, 3]])
    >>> data = tf.data.Dataset.from_tensors(((source, target[:, :-1]), target[:, 1:])).repeat()
    >>> history = trainer.fit(data, steps=2, verbose=0)
    >>> int(trainer.optimizer.iterations)
    2
    """

    def __init__(
        self,
        model,
        optimizer,
        strategy=None,
        label_smoothing=0.1,
        accumulation_steps=1,
        jit_compile=False,
    ):
        super().__init__(model, optimizer, label_smoothing, accumulation_steps)
        self.strategy = strategy or tf.distribute.get_strategy()
        try:
            self._local_replicas = len(self.strategy.extended.worker_devices)
        except RuntimeError:  # the default strategy (no `strategy.scope()`) has no devices
            self._local_replicas = 1
        self._per_replica_batches = False
        with self.strategy.scope():
            model.compile(optimizer=optimizer, loss=self.loss)
            optimizer.build(model.trainable_variables)
            self._accumulators = []
            if accumulation_steps > 1:
                self._accumulators = [
                    tf.Variable(
                        tf.zeros(variable.shape, variable.dtype),
                        trainable=False,
                        synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.SUM,
                    )
                    for variable in model.trainable_variables
                ]
                self._accumulated = tf.Variable(
                    tf.zeros((3,)),
                    trainable=False,
                    synchronization=tf.VariableSynchronization.ON_READ,
                    aggregation=tf.VariableAggregation.SUM,
                )
        self._accumulate_function = tf.function(self._accumulate_on_iterator)
        self._apply_function = tf.function(self._apply_on_iterator)
        self._apply_measured = tf.function(lambda iterator: self._apply_on_iterator(iterator, True))
        self._steps_taken = 0
        self._replica_gradients = tf.function(
            self._gradients, jit_compile=jit_compile, reduce_retracing=True
        )
        self._evaluate_function = tf.function(self._sums, reduce_retracing=True)

    # Replica functions ---------------------------------------------------

    def _sums(self, batch, training=False):
        (source_ids, target_input_ids), target_output_ids = batch
        logits = self.model((source_ids, target_input_ids), training=training)  # (B, T, V)
        loss_sum, tokens = self.loss.token_sums(target_output_ids, logits)
        correct = _correct_tokens(tf.cast(target_output_ids, tf.int32), logits, self.model.pad_id)
        return tf.stack([loss_sum, tokens, correct])  # (3,)

    def _gradients(self, batch):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            sums = self._sums(batch, training=True)
            scaled = self.optimizer.scale_loss(sums[0])
        return tape.gradient(scaled, variables), sums

    def _accumulate_replica(self, batch):
        gradients, sums = self._replica_gradients(batch)
        for accumulator, gradient in zip(self._accumulators, gradients, strict=True):
            accumulator.assign_add(gradient)
        self._accumulated.assign_add(sums)

    def _apply_replica(self, batch, measure=False):
        gradients, sums = self._replica_gradients(batch)
        if self._accumulators:
            gradients = [g + a for g, a in zip(gradients, self._accumulators, strict=True)]
            sums = sums + self._accumulated
            # Automatic control dependencies run these after the reads above.
            for variable in [*self._accumulators, self._accumulated]:
                variable.assign(tf.zeros_like(variable))
        context = tf.distribute.get_replica_context()
        totals = context.all_reduce(tf.distribute.ReduceOp.SUM, sums)  # (3,) global sums
        scale = 1.0 / tf.maximum(totals[1], 1.0)
        gradients = [g * scale for g in gradients]
        # The update's gradient norm; -1: not measured. With several replicas the
        # optimizer sums their gradients inside its update: measuring sums them here
        # first (one more all-reduce), and hands the optimizer a replica's share.
        norm = tf.constant(-1.0)
        replicas = self.strategy.num_replicas_in_sync
        if measure and replicas > 1:
            gradients = context.all_reduce(tf.distribute.ReduceOp.SUM, gradients)
            norm = tf.linalg.global_norm(gradients) / self.optimizer.scale_loss(1.0)
            gradients = [g / replicas for g in gradients]
        elif replicas == 1:
            norm = tf.linalg.global_norm(gradients) / self.optimizer.scale_loss(1.0)
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables, strict=True))
        return tf.concat([totals, [norm]], axis=0)

    # Cross-replica functions ---------------------------------------------

    def _replica_batch(self, iterator):
        """The next batch of every replica of this worker, from a local iterator.

        A dataset function's stream holds one batch per local replica, in
        turn; a dataset's holds global batches, whose rows are split over
        every replica (the first ones take one more where they do not
        divide), as `experimental_distribute_dataset` splits them.
        """
        replicas = self.strategy.num_replicas_in_sync
        if self._per_replica_batches:
            if self._local_replicas == 1:
                return next(iterator)
            batches = [next(iterator) for _ in range(self._local_replicas)]
            return self.strategy.experimental_distribute_values_from_function(
                lambda context: batches[context.replica_id_in_sync_group % len(batches)]
            )
        batch = next(iterator)
        if replicas == 1:
            return batch

        def split(tensor):  # (B, ...) -> `replicas` parts of about B / replicas rows
            rows = tf.shape(tensor)[0]
            sizes = tf.stack([(rows + replicas - 1 - i) // replicas for i in range(replicas)])
            # Sizes unknown while tracing, as a distributed dataset's are: a part of a
            # batch of known shape would otherwise be traced with 0 rows, which the
            # model's reshapes cannot infer.
            sizes = tf.compat.v1.placeholder_with_default(sizes, [replicas])
            return tf.split(tensor, sizes, num=replicas)

        pieces = [split(tensor) for tensor in tf.nest.flatten(batch)]
        parts = [tf.nest.pack_sequence_as(batch, [p[i] for p in pieces]) for i in range(replicas)]
        return self.strategy.experimental_distribute_values_from_function(
            lambda context: parts[context.replica_id_in_sync_group]
        )

    def _accumulate_on_iterator(self, iterator):
        self.strategy.run(self._accumulate_replica, args=(self._replica_batch(iterator),))

    def _apply_on_iterator(self, iterator, measure=False):
        batch = self._replica_batch(iterator)
        totals = self.strategy.run(self._apply_replica, args=(batch, measure))
        # Every replica holds the same all-reduced totals.
        return self.strategy.experimental_local_results(totals)[0]

    def train_step(self, stream):
        """One optimizer step over `accumulation_steps` micro-batches.

        Args:
            stream: a `TensorStream` of batches
                `((source_ids (B, S), target_input_ids (B, T)), target_output_ids (B, T))`:
                global batches, or from a dataset function one per local
                replica in turn (`_replica_batch`).

        Returns:
            float32 `(4,)`: summed loss, real tokens and correct tokens of the
            global batch, and the norm of the update's gradient (of the
            token-mean loss). With several replicas it costs one more
            all-reduce, so it is measured on this process's first step and
            every `NORM_EVERY` steps, -1 between.
        """
        for _ in range(self.accumulation_steps - 1):
            self._accumulate_function(stream.iterator)
        self._steps_taken += 1
        measure = self._steps_taken == 1 or self._steps_taken % NORM_EVERY == 0
        if measure and self.strategy.num_replicas_in_sync > 1:
            return self._apply_measured(stream.iterator)
        return self._apply_function(stream.iterator)

    def evaluate(self, dataset, steps=None):
        """Token-level loss and accuracy on a finite dataset, on this worker alone.

        Returns:
            dict with `loss` (label-smoothed, per token), `accuracy`, `tokens`.
        """
        sums = tf.zeros((3,))
        for batch in dataset.take(steps or -1):
            sums += self._evaluate_function(batch)
        return token_metrics(sums)

    def _batches_per_step(self):
        """Elements of the stream one step reads: a dataset function's are per replica."""
        replicas = self._local_replicas if self._per_replica_batches else 1
        return self.accumulation_steps * replicas

    def _stream(self, dataset):
        """This worker's training stream: a local tf.data iterator (`TensorStream`).

        Batches are placed on the replicas by the step itself (`_replica_batch`)
        rather than by a tf.distribute iterator, which cannot save its position.
        A function of a `tf.distribute.InputContext` is called with this worker's.
        """
        self._per_replica_batches = callable(dataset)
        if callable(dataset):
            replicas = self.strategy.num_replicas_in_sync
            workers = replicas // self._local_replicas
            worker = self.strategy.cluster_resolver.task_id if workers > 1 else 0
            context = tf.distribute.InputContext(workers, worker, replicas)
            dataset = dataset(context)
        return TensorStream(dataset)


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
    (its plan done) given more `minutes` than its plan records trains on
    for the difference: the rate rises back to eq. (3)'s, a new plan is
    made at the first epoch's end and the rate falls to 0 again by its end
    (from where it stands, where the plain fall would have begun already).
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
            if step >= plan["total_steps"] and granted is not None and self.minutes > granted:
                self._extend(step, granted)
                return
            self._set_plan(plan["total_steps"], plan.get("cooldown_from"))
            self.resumed = True
            logger.info("Resuming the time budget's plan of %d steps", self.total_steps)
            if step >= self.total_steps:
                self.model.stop_training = True  # done: not one step more

    def _extend(self, step, granted):
        """Goes on from a finished plan for the minutes beyond the `granted` ones."""
        self.seconds = 60.0 * (self.minutes - granted)
        self.extended_from = step
        if self.schedule is not None:
            self.schedule.set_total_steps(0)  # no plan: eq. (3) until the first one
        logger.info(
            "Time budget: the finished run of %d steps goes on for %.1f more minutes (%.1f in all)",
            step,
            self.minutes - granted,
            self.minutes,
        )

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
            plan["minutes"] = self.minutes
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
