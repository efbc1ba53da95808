"""The optimizer-step loop that `Trainer` (tf.distribute) and `JaxTrainer` share.

A subclass supplies the backend's half: `_distribute(dataset, skip)` (an
iterable of batches ready for its step, `skip` batches into the stream),
`train_step(iterator)` (one optimizer step; the global batch's summed loss,
real tokens and correct tokens) and `evaluate(dataset, steps)`. The loop
drives Keras callbacks the way `keras.Model.fit` does and counts optimizer
steps, so a run resumed by `keras.callbacks.BackupAndRestore` ends where an
uninterrupted one would and reads on from the batch where it stopped.
"""

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
        self.loss = LabelSmoothedCrossEntropy(label_smoothing, pad_id=model.pad_id)

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
    ):
        """Trains until the optimizer has taken `steps` steps in total.

        Args:
            dataset: `tf.data.Dataset` of global batches as in `train_step`,
                repeated (it is read `steps * accumulation_steps` times at
                most), or what the subclass's `_distribute` takes besides
                (`Trainer`: a function of a `tf.distribute.InputContext`). A run
                resumed at step n skips the first `n * accumulation_steps`
                batches, so the input must give the same batches each time
                it is built (a seeded shuffle does).
            steps: int, total optimizer steps, restored ones included.
            steps_per_epoch: int, steps between epoch-end callbacks (validation,
                checkpoints). Defaults to `steps`.
            callbacks: list of `keras.callbacks.Callback`.
            validation_data: finite `tf.data.Dataset`, evaluated each epoch
                into `val_loss` and `val_accuracy`.
            validation_steps: int or None, batches of `validation_data` used.
            verbose: 0, 1, 2 or "auto" as in `model.fit`.

        Returns:
            `keras.callbacks.History` of per-epoch logs: `loss`, `accuracy`,
            `learning_rate`, `tokens_per_second`, `val_*`.
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
        callbacks.on_train_begin()
        step = optimizer_steps(self.optimizer)  # > 0 after BackupAndRestore
        self.initial_step = step
        if step:
            logger.info("Resuming at step %d of %d", step, steps)
        iterator = iter(self._distribute(dataset, skip=step * self.accumulation_steps))
        logs = {}
        for epoch in range(step // steps_per_epoch, epochs):
            callbacks.on_epoch_begin(epoch)
            sums, started = [0.0, 0.0, 0.0], time.perf_counter()
            last = min(steps_per_epoch, steps - epoch * steps_per_epoch)
            for batch in range(step - epoch * steps_per_epoch, last):
                callbacks.on_train_batch_begin(batch)
                totals = np.asarray(self.train_step(iterator))
                sums = [a + float(b) for a, b in zip(sums, totals, strict=True)]
                step += 1
                logs = {
                    **{k: v for k, v in token_metrics(sums).items() if k != "tokens"},
                    "learning_rate": self.learning_rate(),
                    "tokens_per_second": sums[1] / (time.perf_counter() - started),
                }
                callbacks.on_train_batch_end(batch, logs)
                if self.model.stop_training:
                    break
            if validation_data is not None:
                val_logs = self.evaluate(validation_data, validation_steps)
                logs.update({f"val_{k}": v for k, v in val_logs.items() if k != "tokens"})
            callbacks.on_epoch_end(epoch, logs)
            if self.model.stop_training:
                break
        callbacks.on_train_end(logs)
        return self.model.history
