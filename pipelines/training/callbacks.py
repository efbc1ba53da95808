"""The callbacks of a long run: checkpoints that fit the disk, scores while training, stopping.

Each keeps what a resumed run needs in the backup (`get_state`/`set_state`,
saved by `RunBackup`), so a kill resets no count.
"""

import contextlib
import logging
import math
import os
import time

import keras

from pipelines.files import atomic_output, write_json
from pipelines.training.checkpoints import epoch_checkpoints
from pipelines.training.loop import optimizer_steps

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def without_optimizer(model):
    """The model uncompiled, with no optimizer attached, so a save holds its weights alone.

    A compiled model's `.keras` file holds the optimizer's state too (Adam:
    twice the weights); a checkpoint for averaging or export needs only the
    weights, and the rolling backup keeps the optimizer's state. Saved
    uncompiled, the file loads without an optimizer that would look for
    state the file does not hold.
    """
    optimizer, compiled = model.optimizer, model.compiled
    model.optimizer, model.compiled = None, False
    try:
        yield model
    finally:
        model.optimizer, model.compiled = optimizer, compiled


def save_weights_checkpoint(model, path):
    """Writes `model` to the `.keras` file `path` without its optimizer, atomically."""
    with without_optimizer(model), atomic_output(path, suffix=".keras") as staging:
        model.save(staging)


class Checkpoints(keras.callbacks.Callback):
    """Writes weights-only checkpoints at every epoch's end, or every `minutes`, and prunes them.

    Without `minutes` a checkpoint `epoch-N.keras` ends every epoch. With it
    (the paper's 10, section 6.1) one `step-N.keras` is written at the first
    step that ends `minutes` or more after the last one, counted in training
    time (a resumed run counts from its restart), and one more ends the
    training (not after a NaN loss), so that the average of the last ones
    holds its last steps too; it replaces a checkpoint of this process
    written less than half an interval before. With `keep` only the
    newest `keep` are kept (the run keeps at least those averaging reads;
    `best.keras` is apart).

    Args:
        folder: str, the run's `checkpoints/` folder.
        minutes: float or None, minutes between checkpoints (None: each epoch).
        keep: int or None, checkpoints kept (None: all).
        clock: callable returning seconds, `time.perf_counter` by default.
    """

    def __init__(self, folder, minutes=None, keep=None, clock=time.perf_counter):
        super().__init__()
        self.folder = folder
        self.minutes = minutes
        self.keep = keep
        self.clock = clock
        self.written = []

    def on_train_begin(self, logs=None):
        self._last = self.clock()

    def on_train_batch_end(self, batch, logs=None):
        if self.minutes and self.clock() - self._last >= 60.0 * self.minutes:
            self._write(self._step_path())

    def on_epoch_end(self, epoch, logs=None):
        if not self.minutes:
            self._write(os.path.join(self.folder, f"epoch-{epoch + 1:03d}.keras"))

    def on_train_end(self, logs=None):
        if self.minutes and math.isfinite((logs or {}).get("loss", 0.0)):
            path = self._step_path()
            if os.path.exists(path):  # written at this step already
                return
            recent = self.written and self.clock() - self._last < 30.0 * self.minutes
            if recent:  # less than half an interval ago: this one takes its place
                os.remove(self.written.pop())
            self._write(path)

    def _step_path(self):
        step = optimizer_steps(self.model.optimizer)
        return os.path.join(self.folder, f"step-{step:09d}.keras")

    def _write(self, path):
        os.makedirs(self.folder, exist_ok=True)
        save_weights_checkpoint(self.model, path)
        self.written.append(path)
        self._last = self.clock()
        if self.keep:
            self.prune()

    def prune(self):
        """Removes the oldest checkpoints beyond `keep`."""
        for path in epoch_checkpoints(self.folder)[: -self.keep]:
            os.remove(path)


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """`keras.callbacks.EarlyStopping` whose count and best score survive a kill.

    The backup saves `get_state()`; a resumed run's `set_state` restores the
    epochs waited and the best value, so patience is counted over the whole
    run. Best weights are not held in memory: the run keeps its best
    checkpoint on disk instead (`output.select`).
    """

    def __init__(self, monitor="val_loss", patience=0, min_delta=0.0, mode="auto"):
        super().__init__(monitor, min_delta=min_delta, patience=patience, mode=mode)

    def get_state(self):
        best = float(self.best) if self.best is not None else None
        return {
            "wait": int(self.wait),
            "best": best if best is None or math.isfinite(best) else None,
            "best_epoch": int(self.best_epoch),
            "stopped": bool(self.stopped_epoch),
        }

    def set_state(self, state):
        self.wait = state["wait"]
        self.best_epoch = state["best_epoch"]
        if state["best"] is not None:
            self.best = state["best"]
        if state.get("stopped") and self.wait >= self.patience:
            # A rerun of a run early stopping ended stays ended (a larger
            # patience lets it go on).
            self.stopped_epoch = state["best_epoch"] + self.wait
            self.model.stop_training = True


class BestCheckpoint(keras.callbacks.Callback):
    """Keeps the weights of the best validation so far in `best.keras`, and says which they are.

    After each epoch whose logs hold `monitor` better than the best by more
    than `min_delta`, the weights are written to `folder/best.keras` and
    `folder/best.json` records the step, epoch and value.

    Args:
        folder: str, the run's `checkpoints/` folder.
        monitor: str, a key of the epoch's logs (`val_loss`, `val_bleu`).
        mode: "min" or "max".
        min_delta: float, the least change that counts as better.
        weights: callable returning a context manager inside which the
            model holds the weights that were validated (the trainer's
            `ema_weights`), or None.
    """

    def __init__(self, folder, monitor="val_loss", mode="min", min_delta=0.0, weights=None):
        super().__init__()
        self.weights = weights or contextlib.nullcontext
        self.folder = folder
        self.monitor = monitor
        self.sign = -1.0 if mode == "min" else 1.0
        self.min_delta = min_delta
        self.best = None

    @property
    def path(self):
        return os.path.join(self.folder, "best.keras")

    def on_epoch_end(self, epoch, logs=None):
        value = (logs or {}).get(self.monitor)
        if value is None or not math.isfinite(value):
            return
        if self.best is not None and self.sign * (value - self.best) <= self.min_delta:
            return
        self.best = float(value)
        os.makedirs(self.folder, exist_ok=True)
        with self.weights():
            save_weights_checkpoint(self.model, self.path)
        record = {"epoch": epoch + 1, "step": optimizer_steps(self.model.optimizer)}
        write_json(os.path.join(self.folder, "best.json"), {**record, self.monitor: self.best})
        logger.info("Best %s so far: %.4f at step %d", self.monitor, self.best, record["step"])

    def get_state(self):
        return {"best": self.best}

    def set_state(self, state):
        self.best = state["best"]
