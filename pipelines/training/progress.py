"""Training progress as plain lines, for a log file (nohup, CI, a cluster's job log).

Keras's progress bar rewrites one terminal line with control characters many
times an epoch; written to a file that is one line of megabytes. When stdout
is not a terminal the run prints `ProgressLines` instead: one line an epoch.
"""

import sys
import time

import keras


def _minutes(seconds):
    minutes, seconds = divmod(int(round(seconds)), 60)
    return f"{minutes}m{seconds:02d}s"


def _value(key, value):
    """`key value`: rates and norms, small numbers, to 4 significant digits."""
    small = key in ("learning_rate", "gradient_norm")
    return f"{key} {float(value):.4g}" if small else f"{key} {float(value):.4f}"


class ProgressLines(keras.callbacks.Callback):
    """Prints one line at the end of every epoch: step, metrics, rate, time left.

    Example line:
        epoch 3: step 600/1600, loss 3.2104, gradient_norm 0.8312,
        learning_rate 0.0007424, val_loss 3.0012, 2.1 steps/s, 4m46s
        elapsed, about 7m56s left

    Args:
        planned_steps: callable returning the run's planned total steps (an
            int, or None while unknown, as under a time budget before its
            first plan).
        stream: a text stream, default `sys.stdout`.
        clock: callable returning seconds, default `time.monotonic`.
    """

    KEYS = (
        "loss",
        "accuracy",
        "gradient_norm",
        "learning_rate",
        "val_loss",
        "val_accuracy",
        "val_bleu",
        "val_chrf",
    )

    def __init__(self, planned_steps, stream=None, clock=time.monotonic):
        super().__init__()
        self.planned_steps = planned_steps
        self.stream = stream
        self.clock = clock

    def on_train_begin(self, logs=None):
        self._started = self.clock()
        self._first_step = int(self.model.optimizer.iterations.numpy())

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        step = int(self.model.optimizer.iterations.numpy())
        elapsed = self.clock() - self._started
        rate = (step - self._first_step) / max(elapsed, 1e-9)
        planned = self.planned_steps()
        parts = [f"step {step}" + (f"/{planned}" if planned else "")]
        parts += [_value(key, logs[key]) for key in self.KEYS if key in logs]
        parts += [f"{rate:.2f} steps/s", f"{_minutes(elapsed)} elapsed"]
        if planned and rate > 0:
            parts.append(f"about {_minutes(max(planned - step, 0) / rate)} left")
        print(f"epoch {epoch + 1}: " + ", ".join(parts), file=self.stream or sys.stdout, flush=True)
