"""The optimizer-step loop that `Trainer` (tf.distribute) and `JaxTrainer` share.

A subclass supplies the backend's half: `_stream(dataset)` (the training
stream, a `streams.TensorStream` or another iterator with `save`, `restore`
and `skip`), `train_step(stream)` (one optimizer step; the global batch's
summed loss, real tokens and correct tokens, and the gradient's norm) and
`evaluate(dataset, steps)`.
The loop drives Keras callbacks the way `keras.Model.fit` does and counts
optimizer steps; with a `RunBackup` it saves the whole training state every
few steps, and a run restored from it ends where an uninterrupted one would,
reading on from the batch where it stopped.
"""

import contextlib
import logging
import math
import time

import keras
import numpy as np

from keras_transformer.losses import LabelSmoothedCrossEntropy

logger = logging.getLogger(__name__)


def token_metrics(sums):
    """Per-token loss and accuracy from summed `(loss, real tokens, correct tokens)`.

    Returns:
        dict with `loss` (label-smoothed, per token), `accuracy`, `tokens`.
    """
    loss_sum, tokens, correct = (float(x) for x in sums)
    return {
        "loss": loss_sum / max(tokens, 1.0),
        "accuracy": correct / max(tokens, 1.0),
        "tokens": tokens,
    }


def optimizer_steps(optimizer):
    """int: the updates `optimizer` has applied (restored ones included)."""
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


class TrainingLoop:
    """Base class of the trainers: `fit` by optimizer steps, with callbacks.

    Subclasses implement `_distribute`, `train_step` and `evaluate` (see the
    module docstring).

    Args:
        model: a built `Transformer`.
        optimizer: a Keras optimizer.
        label_smoothing: float, section 5.4.
        accumulation_steps: int, micro-batches per optimizer step.
    """

    def __init__(self, model, optimizer, label_smoothing=0.1, accumulation_steps=1):
        if accumulation_steps < 1:
            raise ValueError(
                "accumulation_steps must be >= 1. "
                f"Received: accumulation_steps={accumulation_steps}"
            )
        self.model = model
        self.optimizer = optimizer
        self.accumulation_steps = accumulation_steps
        self.validation_seconds = 0.0
        self.first_step_time = None  # `time.perf_counter()` as this process's first step ended
        self.started = time.perf_counter()  # the run's start, for the log (a run sets its own)
        self.loss = LabelSmoothedCrossEntropy(label_smoothing, pad_id=model.pad_id)

    def _restore(self, backup, stream, callbacks, steps):
        """Restores the newest backup, starts the callbacks; returns the step training is at."""
        restored = backup.restore(self.model, stream) if backup else None
        callbacks.on_train_begin()
        step = optimizer_steps(self.optimizer)  # > 0 once restored
        self.initial_step = step
        if step:
            logger.info("Resuming at step %d of %d", step, steps)
        if restored:
            set_callbacks_state(callbacks, restored.get("callbacks", {}))
        stream_step = restored["stream_step"] if restored else 0
        if step > stream_step:
            logger.info("Skipping the %d batches the restored steps read", step - stream_step)
            stream.skip((step - stream_step) * self._batches_per_step())
        return step

    def _batches_per_step(self):
        """Elements of the training stream one step reads."""
        return self.accumulation_steps

    def _first_step(self, step):
        if self.first_step_time is None:
            self.first_step_time = time.perf_counter()
            logger.info(
                "First step of this process: step %d, %.2f s after the run started",
                step,
                self.first_step_time - self.started,
            )

    def _validate(self, dataset, steps, scores):
        """The `val_*` logs: loss and accuracy on `dataset`, `scores(model)`, on the EMA if kept."""
        logs = {}
        if dataset is None and scores is None:
            return logs
        started = time.perf_counter()
        with self.ema_weights():
            if dataset is not None:
                logs.update(self.evaluate(dataset, steps))
                del logs["tokens"]
            if scores is not None:
                logs.update(scores(self.model))
        seconds = time.perf_counter() - started
        self.validation_seconds += seconds
        logger.info("Validation: %.1f s", seconds)
        return {f"val_{k}": v for k, v in logs.items()}

    @contextlib.contextmanager
    def ema_weights(self):
        """Holds the moving average of the weights in the model's variables inside the block.

        Where the optimizer keeps one (`use_ema`), the model computes with
        the averaged weights until the block ends, then gets its own back;
        elsewhere the block runs on the model as it is.
        """
        optimizer = getattr(self.optimizer, "inner_optimizer", self.optimizer)
        if not optimizer.use_ema:
            yield self.model
            return
        variables = self.model.trainable_variables
        current = [keras.ops.convert_to_numpy(v) for v in variables]
        try:
            optimizer.finalize_variable_values(variables)
            yield self.model
        finally:
            for variable, value in zip(variables, current, strict=True):
                variable.assign(value)

    def learning_rate(self):
        """float: the rate the optimizer's next update will use."""
        return float(keras.ops.convert_to_numpy(self.optimizer.learning_rate))

    @property
    def spans_processes(self):
        """Whether the model's weights are arrays shared by several processes (no: one)."""
        return False

    def join_processes(self):
        """Waits until every process of the run gets here (one process: at once)."""

    def fit(
        self,
        dataset,
        steps,
        steps_per_epoch=None,
        callbacks=None,
        validation_data=None,
        validation_steps=None,
        verbose="auto",
        backup=None,
        validation_scores=None,
    ):
        """Trains until the optimizer has taken `steps` steps in total.

        Args:
            dataset: `tf.data.Dataset` of global batches as in `train_step`,
                repeated (it is read `steps * accumulation_steps` times at
                most), or what the subclass's `_stream` takes besides
                (`Trainer`: a function of a `tf.distribute.InputContext`).
                A run restored from `backup` restores the stream's position,
                so the input must be built the same way each time (the
                same stages and seeds).
            steps: int, total optimizer steps, restored ones included.
            steps_per_epoch: int, steps between epoch-end callbacks (validation,
                checkpoints). Defaults to `steps`.
            callbacks: list of `keras.callbacks.Callback`.
            validation_data: finite `tf.data.Dataset`, evaluated each epoch
                into `val_loss` and `val_accuracy`.
            validation_steps: int or None, batches of `validation_data` used.
            verbose: 0, 1, 2 or "auto" as in `model.fit`.
            validation_scores: callable from the model to a dict of
                scores (`{"bleu": ..., "chrf": ...}`), logged as `val_*`
                at each epoch's end, or None.
            backup: a `RunBackup`, or None. Its newest backup is restored
                before training (weights, optimizer, stream, the state of
                callbacks with `get_state`/`set_state`), it saves every
                `backup.every` steps and when training ends. Where the
                weights were restored otherwise (a Keras `BackupAndRestore`
                callback), the stream reads past the batches the restored
                steps took.

        Returns:
            `keras.callbacks.History` of per-epoch logs: `loss`, `accuracy`,
            `learning_rate`, `tokens_per_second`, `gradient_norm` (the last
            measured update's, where the trainer measures it), `val_*`.
        """
        steps_per_epoch = steps_per_epoch or steps
        epochs = math.ceil(steps / steps_per_epoch)
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=1 if verbose == "auto" else verbose,
            epochs=epochs,
            steps=steps_per_epoch,
            model=self.model,
        )
        self.model.stop_training = False
        stream = self._stream(dataset)
        step = self._restore(backup, stream, callbacks, steps)
        logs, norm = {}, None
        for epoch in range(step // steps_per_epoch, epochs):
            if self.model.stop_training:  # restored: early stopping had ended the run
                break
            callbacks.on_epoch_begin(epoch)
            sums, started = [0.0, 0.0, 0.0], time.perf_counter()
            last = min(steps_per_epoch, steps - epoch * steps_per_epoch)
            for batch in range(step - epoch * steps_per_epoch, last):
                callbacks.on_train_batch_begin(batch)
                totals = np.asarray(self.train_step(stream))
                sums = [a + float(b) for a, b in zip(sums, totals[:3], strict=True)]
                step += 1
                self._first_step(step)
                logs = {
                    **{k: v for k, v in token_metrics(sums).items() if k != "tokens"},
                    "learning_rate": self.learning_rate(),
                    "tokens_per_second": sums[1] / (time.perf_counter() - started),
                }
                if totals[3] >= 0:  # the last measured update's
                    norm = float(totals[3])
                if norm is not None:
                    logs["gradient_norm"] = norm
                callbacks.on_train_batch_end(batch, logs)
                # An epoch's last step is backed up after its validation and callbacks.
                if batch + 1 < last and _backup_due(backup, step, logs):
                    backup.save(step, self.model, stream, callbacks_state(callbacks))
                if self.model.stop_training:
                    break
            logs.update(self._validate(validation_data, validation_steps, validation_scores))
            callbacks.on_epoch_end(epoch, logs)
            if _backup_due(backup, step, logs):
                backup.save(step, self.model, stream, callbacks_state(callbacks))
            if self.model.stop_training:
                break
        if backup and math.isfinite(logs.get("loss", 0.0)):
            # The end too, so a rerun with more steps continues from here (not
            # after a NaN loss: the backup before it stays).
            backup.save(step, self.model, stream, callbacks_state(callbacks))
        callbacks.on_train_end(logs)
        return self.model.history


def _backup_due(backup, step, logs):
    """Whether `step` ends with a backup: due, and not after a NaN loss (the last one stays)."""
    return backup is not None and backup.due(step) and math.isfinite(logs.get("loss", 0.0))


def callbacks_state(callbacks):
    """`{class name: state}` of the callbacks that keep one (`get_state()`)."""
    return {
        type(callback).__name__: callback.get_state()
        for callback in callbacks.callbacks
        if hasattr(callback, "get_state")
    }


def set_callbacks_state(callbacks, states):
    """Gives each callback with `set_state` the state `callbacks_state` saved for it."""
    for callback in callbacks.callbacks:
        name = type(callback).__name__
        if hasattr(callback, "set_state") and name in states:
            callback.set_state(states[name])
