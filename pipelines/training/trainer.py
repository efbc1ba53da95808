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

import logging

import tensorflow as tf

from pipelines.training.loop import TrainingLoop, token_metrics
from pipelines.training.streams import TensorStream

logger = logging.getLogger(__name__)

# With several replicas the gradient's norm is measured on this process's first step and
# every NORM_EVERY steps (`kt train` logs to TensorBoard as often).
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
    >>> import keras
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

        Args:
            dataset: a finite `tf.data.Dataset` of batches
                `((source_ids (B, S), target_input_ids (B, T)), target_output_ids (B, T))`.
            steps: int or None, the number of batches to read (None: all).

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
