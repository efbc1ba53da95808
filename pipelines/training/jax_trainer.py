"""Training on the JAX backend: `Trainer`'s token-exact steps, data-parallel through Keras.

`JaxTrainer` keeps `Trainer`'s loop and callbacks (`TrainingLoop`) and
compiles its own step with `jax.jit` over Keras's stateless API
(`model.stateless_call`, the optimizer's `apply` in a `keras.StatelessScope`)
rather than using `keras.Model.fit`, which cannot give the same run
(Keras 3.15): its gradient accumulation (`gradient_accumulation_steps`)
averages each micro-batch's own token mean, where a step here divides the
loss summed over every micro-batch by their total token count; a run that
`keras.callbacks.BackupAndRestore` resumes starts its input stream anew, where the loop
reads on from where the interrupted run stopped (`RunBackup`); and the variables a
learning-rate schedule reads (the time budget's `total_steps` and
`cooldown_from`) would be
constants of the compiled step, fixed when it was traced.

Data parallelism: build the model and the trainer under a
`keras.distribution.DataParallel` scope, so the variables are replicated on
every device; each global batch is split by rows over the devices (the rows
must divide by their number) and XLA all-reduces the gradients. The summed
loss and token count are those of the global batch, so N devices take the
step one device takes on the same batch. With several processes
(`keras.distribution.initialize`), each reads its own shards and places its
rows of each global batch (`ProcessBatches` agrees on the batch's shape);
validation batches, small, every process reads whole and places its rows.
"""

import functools
import logging
import os
import time

import jax
import keras
import numpy as np
from keras import ops

from pipelines.training.loop import TrainingLoop, token_metrics
from pipelines.training.streams import MappedStream, TensorStream, to_numpy

logger = logging.getLogger(__name__)


def correct_tokens(labels, logits, pad_id):
    """float32 scalar: real (non-pad) tokens of `labels` (B, T) that `logits` (B, T, V) predict."""
    predictions = ops.argmax(logits, axis=-1)
    real = ops.not_equal(labels, pad_id)
    right = ops.equal(ops.cast(predictions, "int32"), ops.cast(labels, "int32"))
    return ops.sum(ops.cast(ops.logical_and(real, right), "float32"))


def _values(variables):
    return [variable.value for variable in variables]


def _next(iterator):
    try:
        return next(iterator)
    except StopIteration:
        raise ValueError(
            "The training dataset ran out of batches before the last step: repeat it"
        ) from None


def _assign(variables, values):
    for variable, value in zip(variables, values, strict=True):
        variable.assign(value)


class JaxTrainer(TrainingLoop):
    """Trains a `Transformer` on the JAX backend, on one device or data-parallel.

    The same interface and results as `Trainer`: `fit` counts optimizer
    steps (restored ones included), each step's loss is the token mean of
    the global batch over all `accumulation_steps` micro-batches, and the
    Keras variables hold the trained state after every step, for callbacks
    and checkpoints.

    Args:
        model: a built `Transformer`, created under `distribution`'s scope.
        optimizer: a Keras optimizer (not a `LossScaleOptimizer`: use the
            `mixed_bfloat16` policy on JAX, which needs no loss scaling).
        distribution: a `keras.distribution.Distribution`, or None for the
            current one (None: one device).
        label_smoothing: float, section 5.4.
        accumulation_steps: int, micro-batches per optimizer step.
        schedule: the optimizer's learning-rate schedule. Required where it
            holds variables that change while training (a
            `TransformerSchedule` with a cooldown, which a time budget
            sets): the compiled step reads them as inputs. Without it, the
            step keeps the values it was compiled with.

    Example:
    >>> import keras_transformer as kt, tensorflow as tf
    >>> model = kt.Transformer(50, num_layers=1, hidden_dim=8, intermediate_dim=16, num_heads=2)
    >>> model.build(((None, None), (None, None)))
    >>> trainer = JaxTrainer(model, keras.optimizers.Adam(1e-3))
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
        distribution=None,
        label_smoothing=0.1,
        accumulation_steps=1,
        schedule=None,
    ):
        if keras.backend.backend() != "jax":
            raise ValueError(f"JaxTrainer needs the JAX backend, not {keras.backend.backend()}")
        super().__init__(model, optimizer, label_smoothing, accumulation_steps)
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise ValueError(
                "JaxTrainer does not scale losses: train in mixed_bfloat16, not mixed_float16"
            )
        self.distribution = distribution or keras.distribution.distribution()
        self._schedule_variables = list(schedule.variables) if schedule is not None else []
        model.compile(optimizer=optimizer, loss=self.loss)
        if self.distribution is None:
            optimizer.build(model.trainable_variables)
        else:
            with self.distribution.scope():  # replicated like the model's variables
                optimizer.build(model.trainable_variables)
        # The state a step replaces is donated, so the weights are held once
        # (an applying step's outputs have no room for accumulated gradients).
        self._accumulate_function = jax.jit(self._accumulate, donate_argnums=(1, 2))
        self._apply_function = jax.jit(self._apply, donate_argnums=(0, 1, 2))
        self._evaluate_function = jax.jit(self._sums, static_argnames="training")

    # Compiled functions --------------------------------------------------

    def _sums(self, trainable, non_trainable, batch, training=False):
        (source_ids, target_input_ids), target_output_ids = batch
        logits, non_trainable = self.model.stateless_call(
            trainable, non_trainable, (source_ids, target_input_ids), training=training
        )  # (B, T, V)
        loss_sum, tokens = self.loss.token_sums(target_output_ids, logits)
        correct = correct_tokens(target_output_ids, logits, self.model.pad_id)
        return ops.stack([loss_sum, tokens, correct]), non_trainable  # (3,)

    def _gradients(self, trainable, non_trainable, pending, batch):
        """Gradients of the summed loss and the sums, added to `pending` ones."""

        def loss_sum(trainable):
            sums, updated = self._sums(trainable, non_trainable, batch, training=True)
            return sums[0], (sums, updated)

        gradients, (sums, non_trainable) = jax.grad(loss_sum, has_aux=True)(trainable)
        if pending is not None:
            gradients = [g + p for g, p in zip(gradients, pending[0], strict=True)]
            sums = sums + pending[1]
        return gradients, sums, non_trainable

    def _accumulate(self, trainable, non_trainable, pending, batch):
        gradients, sums, non_trainable = self._gradients(trainable, non_trainable, pending, batch)
        return non_trainable, (gradients, sums)

    def _apply(self, trainable, non_trainable, optimizer_variables, pending, schedule, batch):
        gradients, sums, non_trainable = self._gradients(trainable, non_trainable, pending, batch)
        scale = 1.0 / ops.maximum(sums[1], 1.0)  # the global batch's token mean
        gradients = [g * scale for g in gradients]
        norm = ops.sqrt(sum(ops.sum(ops.square(g)) for g in gradients))
        mapping = [
            *zip(self.model.trainable_variables, trainable, strict=True),
            *zip(self.optimizer.variables, optimizer_variables, strict=True),
            *zip(self._schedule_variables, schedule, strict=True),
        ]
        # `optimizer.stateless_apply`, with the schedule's variables mapped too.
        with keras.StatelessScope(state_mapping=mapping) as scope:
            self.optimizer.apply(gradients)
        trainable = [scope.get_current_value(v) for v in self.model.trainable_variables]
        optimizer_variables = [scope.get_current_value(v) for v in self.optimizer.variables]
        return trainable, non_trainable, optimizer_variables, ops.concatenate([sums, norm[None]])

    @property
    def spans_processes(self):
        """Whether the model's weights are arrays of several processes (a multi-process run)."""
        return jax.process_count() > 1

    def join_processes(self):
        """Waits until every process gets here: the others wait for process 0's last work.

        JAX's own barrier at exit gives up after 5 minutes, which the
        end-of-run decode of a large held-out set can take.
        """
        if self.spans_processes:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("keras_transformer: end of run")

    # The loop's half -----------------------------------------------------

    def _place(self, batch, process_local=False):
        """A batch of NumPy arrays as JAX arrays split by rows over the devices.

        `batch` is the global batch, which every process holds whole, or with
        `process_local` this process's rows of it (`ProcessBatches`).
        """
        if process_local and self.spans_processes:
            return jax.tree.map(self._place_local_rows, batch)
        return jax.tree.map(self._place_array, batch)

    def _place_local_rows(self, array):
        shape = (array.shape[0] * jax.process_count(), *array.shape[1:])
        self._check_rows(shape[0])
        sharding = self.distribution.get_data_layout(shape).backend_layout
        return jax.make_array_from_process_local_data(sharding, array, shape)

    def _check_rows(self, rows):
        devices = self.distribution.device_mesh.devices.size
        if rows % devices:
            raise ValueError(
                f"A batch of {rows} rows does not split over {devices} devices: "
                "batch with a row multiple of the device count (`batching.batch_examples`'s "
                "row_multiple)"
            )

    def _place_array(self, array):
        if self.distribution is None:
            return jax.numpy.asarray(array)
        self._check_rows(array.shape[0])
        sharding = self.distribution.get_data_layout(array.shape).backend_layout
        # Every process holds the whole global batch and places the rows of
        # its own devices, wherever the mesh puts them.
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])

    def _stream(self, dataset):
        """The placed batches of `dataset`: a stream whose position a backup saves.

        `dataset` is a tf.data dataset of global batches (a `TensorStream`
        placed batch by batch), or a `ProcessBatches` of this process's rows.
        """
        if getattr(dataset, "process_local", False):
            return MappedStream(iter(dataset), lambda batch: self._place(batch, process_local=True))
        return MappedStream(TensorStream(dataset), lambda batch: self._place(to_numpy(batch)))

    def train_step(self, stream):
        """One optimizer step over `accumulation_steps` micro-batches.

        Args:
            stream: iterator over placed batches of
                `((source_ids (B, S), target_input_ids (B, T)), target_output_ids (B, T))`.

        Returns:
            float32 `(4,)`: summed loss, real tokens and correct tokens of the
            global batch, and the norm of the update's gradient (of the
            token-mean loss).
        """
        model, optimizer = self.model, self.optimizer
        trainable = _values(model.trainable_variables)
        non_trainable = _values(model.non_trainable_variables)
        # Every micro-batch is read first: running out leaves the state untouched.
        *micro_batches, last = [_next(stream) for _ in range(self.accumulation_steps)]
        pending = None  # zeros, not None, so each shape compiles one accumulating step
        if micro_batches:
            pending = ([jax.numpy.zeros_like(value) for value in trainable], jax.numpy.zeros(3))
        for batch in micro_batches:
            non_trainable, pending = self._accumulate_function(
                trainable, non_trainable, pending, batch
            )
        trainable, non_trainable, optimizer_variables, sums = self._apply_function(
            trainable,
            non_trainable,
            _values(optimizer.variables),
            pending,
            _values(self._schedule_variables),
            last,
        )
        # The variables hold every step's state, for callbacks and checkpoints.
        _assign(model.trainable_variables, trainable)
        _assign(model.non_trainable_variables, non_trainable)
        _assign(optimizer.variables, optimizer_variables)
        return sums

    def evaluate(self, dataset, steps=None):
        """Token-level loss and accuracy on a finite dataset (of batches as in `train_step`).

        Args:
            dataset: an iterable of batches
                `((source_ids (B, S), target_input_ids (B, T)), target_output_ids (B, T))`.
            steps: int or None, the number of batches to read (None: all).

        Returns:
            dict with `loss` (label-smoothed, per token), `accuracy`, `tokens`.
        """
        trainable = _values(self.model.trainable_variables)
        non_trainable = _values(self.model.non_trainable_variables)
        sums = np.zeros(3)
        for batch in dataset.take(steps or -1).as_numpy_iterator():
            batch_sums, _ = self._evaluate_function(trainable, non_trainable, self._place(batch))
            sums += np.asarray(batch_sums)
        return token_metrics(sums)


def jax_budget_clock(started, clock=time.perf_counter):
    """Seconds since the run started, as a `TimeBudget` clock: the same in every process.

    With several JAX processes a reading is the longest any process has run
    since its `started` (gathered from all of them), so all take the same
    budget decisions at the same steps (see `budget.budget_clock`); one
    process reads `clock` alone.

    Args:
        started: float, this process's `clock()` reading at its start.
        clock: function returning seconds, `time.perf_counter` by default.

    Returns:
        function of no arguments returning float seconds.
    """
    if jax.process_count() == 1:
        return lambda: clock() - started
    from jax.experimental import multihost_utils

    def longest():
        seconds = np.array([clock() - started], np.float64)
        return float(np.max(multihost_utils.process_allgather(seconds)))

    return longest


@functools.cache
def make_distribution():
    """`keras.distribution.DataParallel` over every device of every process.

    Several processes (hosts) join through `keras.distribution.initialize`,
    which reads `KERAS_DISTRIBUTION_JOB_ADDRESSES` (the coordinator's
    address first), `KERAS_DISTRIBUTION_NUM_PROCESSES` and
    `KERAS_DISTRIBUTION_PROCESS_ID`: set them in each process's environment.
    One distribution serves the whole process (the result is cached).

    Returns:
        `(distribution, process_index)`; process 0 is the chief that writes outputs.
    """
    if int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1")) > 1:
        # Collectives between the processes of CPU devices (tests, CPU hosts) go through
        # gloo; GPUs and TPUs use their own.
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        keras.distribution.initialize()
    devices = keras.distribution.list_devices()
    return keras.distribution.DataParallel(devices=devices), jax.process_index()
