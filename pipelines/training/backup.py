"""A run's rolling backup: everything a killed or extended run needs to go on exactly.

`RunBackup` writes, every `every` steps and when training ends, one folder
`backup/step-NNNNNNNNN/` holding:
  - `weights.weights.h5`: the model's weights and the optimizer's state
    (Keras's `save_weights` of a compiled model; EMA weights included);
  - `non_trainable.npz`: every non-trainable variable, the random
    generators' states of the dropout layers among them (which
    `save_weights` leaves out), so a resumed run draws the dropout masks an
    uninterrupted one would;
  - `stream*`: where the input stream stands (`streams.TensorStream`), so
    the resumed run reads on from there, whatever the step;
  - `state.json`: the step, and the state of every callback that keeps one
    (`get_state`/`set_state`: early stopping's count, the best score).
The folder is written under a staging name, its files flushed to disk, and
renamed whole; older ones are renamed to staging names before they are
removed, so a kill at any moment leaves the newest complete backup, and
nothing else, under a `step-N` name. A worker of a run of several (workers
or JAX processes) keeps its previous backup too and resumes from the newest
step every worker holds (`peers`): a kill between two workers' saves leaves
them one save apart. The last backup is kept when training ends: rerunning the command
with more `steps` continues the finished run from its last step.

Why not `keras.callbacks.BackupAndRestore`: it saves weights and a step
count only (not the stream's position or other callbacks' state), its two
files are replaced one at a time (a kill between them pairs a new weights
file with an old step), and it deletes the backup when training ends.
"""

import logging
import os
import re
import shutil
import time

import keras
import numpy as np

from pipelines.errors import CheckpointError
from pipelines.files import read_json, staging_folder, write_json

logger = logging.getLogger(__name__)

WEIGHTS = "weights.weights.h5"
NON_TRAINABLE = "non_trainable.npz"
STATE = "state.json"
STREAM = "stream"
# The files Keras's BackupAndRestore wrote, in backups of earlier versions.
KERAS_BACKUP = "training_metadata.json"
_STEP_FOLDER = re.compile(r"step-(\d+)$")


def backup_folders(backup_dir):
    """The complete backups in `backup_dir`, oldest first, as `(step, path)`."""
    found = []
    if os.path.isdir(backup_dir):
        for name in os.listdir(backup_dir):
            match = _STEP_FOLDER.match(name)
            path = os.path.join(backup_dir, name)
            if match and os.path.isfile(os.path.join(path, STATE)):
                found.append((int(match.group(1)), path))
    return sorted(found)


def data_order_seed(seed, restarted_at=None):
    """The seed of the training data's order: the run's, or one of its own after a restart.

    A run resumed with another batching cannot read on from its saved
    position (the batches differ); its stream starts anew at the restored
    step, shuffled by a seed drawn from the run's and that step, so it does
    not replay the order the run began with.

    Args:
        seed: int, the run's seed.
        restarted_at: int or None, the step the stream starts anew at.

    Returns:
        int.
    """
    if restarted_at is None:
        return seed
    return int(np.random.SeedSequence([seed, restarted_at]).generate_state(1)[0])


class RunBackup:
    """Saves and restores a run's whole training state (see the module docstring).

    Args:
        backup_dir: str, the run's `backup/` folder.
        every: int, steps between backups.
        stream_settings: dict, the settings the input stream's position
            depends on (batch tokens, accumulation); where a backup holds
            others, its position is not restored and the stream starts anew
            (`choose_data_seed`).
        peers: list of str, the `backup/` folders of the run's other workers
            (on storage every worker sees), or empty for a run of one.

    Example:
    >>> backup = RunBackup("/tmp/run/backup", every=100)
    >>> backup.latest_step() is None
    True
    """

    def __init__(self, backup_dir, every=100, stream_settings=None, peers=()):
        if every < 1:
            raise ValueError(f"every must be >= 1. Received: every={every}")
        self.backup_dir = backup_dir
        self.every = every
        self.stream_settings = stream_settings or {}
        self.peers = list(peers)
        self.data_seed = None
        self.saved_step = None
        self.save_seconds = []

    def _latest(self):
        """`(step, folder)` of the newest backup this worker and its peers all hold, or None."""
        mine = backup_folders(self.backup_dir)
        steps = {step for step, _ in mine}
        for peer in self.peers:
            steps &= {step for step, _ in backup_folders(peer)}
        chosen = [(step, folder) for step, folder in mine if step in steps]
        return chosen[-1] if chosen else None

    def latest_step(self):
        """int or None: the step of the newest complete backup (every worker's)."""
        latest = self._latest()
        return latest[0] if latest else None

    def latest_state(self):
        """dict or None: the newest backup's `state.json`."""
        latest = self._latest()
        return read_json(os.path.join(latest[1], STATE)) if latest else None

    def _restarts(self, state):
        """Whether the stream starts anew: a backup's of other settings, or a service's.

        A tf.data service's stream has no position to save (its iterator
        cannot be checkpointed), so a resume on a service starts its data
        order anew at the restored step rather than reading past it.
        """
        changed = state.get("stream_settings", {}) != self.stream_settings
        return changed or bool(self.stream_settings.get("data_service"))

    def choose_data_seed(self, seed):
        """The data order's seed for this process: the run's, or the one a restart drew.

        A stream that starts anew (the newest backup's stream settings
        differ from this run's) draws a seed from the run's and the step; a
        run restored from a backup that a restarted stream wrote keeps that
        backup's seed, so its saved position is restored into the stream it
        was taken from. The seed is recorded in every backup this object
        writes.

        Args:
            seed: int, the run's seed.

        Returns:
            int, the seed to build the training stream with.
        """
        state = self.latest_state()
        if state is None:
            self.data_seed = seed
        elif self._restarts(state):
            self.data_seed = data_order_seed(seed, state["step"])
        else:  # a backup written without a chosen seed holds null: the run's
            recorded = state.get("data_seed")
            self.data_seed = seed if recorded is None else recorded
        return self.data_seed

    def check_format(self):
        """Raises `CheckpointError` for a backup an earlier version wrote (it cannot resume)."""
        if os.path.exists(os.path.join(self.backup_dir, KERAS_BACKUP)):
            raise CheckpointError(
                f"{self.backup_dir} holds a backup of an earlier version of this package, "
                "which the current one cannot resume: finish the run with that version, "
                "or start it in a new output_dir"
            )

    def restore(self, model, stream):
        """Loads the newest backup into `model` (and its optimizer) and `stream`.

        Args:
            model: the compiled, built model whose optimizer is built.
            stream: the training stream (`save`/`restore`), or None.

        Returns:
            dict, the backup's `state.json` (`step`, `callbacks`, and
            `stream_step`: the step the stream stands at, 0 where the
            backup holds no position), or None where there is no backup.
        """
        self.check_format()
        latest = self._latest()
        if latest is None:
            return None
        step, folder = latest
        started = time.perf_counter()
        model.load_weights(os.path.join(folder, WEIGHTS))
        with np.load(os.path.join(folder, NON_TRAINABLE)) as saved:
            values = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        for variable, value in zip(model.non_trainable_variables, values, strict=True):
            variable.assign(value)
        state = read_json(os.path.join(folder, STATE))
        state["stream_step"] = 0
        if self._restarts(state):
            logger.info(
                "The data order starts anew at step %d: %s -> %s",
                step,
                state.get("stream_settings"),
                self.stream_settings,
            )
            state["stream_step"] = step
        elif stream is not None and state.get("stream"):
            stream.restore(os.path.join(folder, STREAM))
            state["stream_step"] = step
        self.saved_step = step
        logger.info("Restored the backup of step %d in %.1f s", step, time.perf_counter() - started)
        return state

    def due(self, step):
        """Whether step `step` ends with a backup."""
        return step % self.every == 0 and step != self.saved_step

    def save(self, step, model, stream, callbacks_state):
        """Writes the backup of `step`, then removes the older ones.

        Args:
            step: int, the optimizer steps taken.
            model: the model (its optimizer's state is saved with it).
            stream: the training stream, or None (a resume then reads from
                the start).
            callbacks_state: dict, JSON-able state by callback name.
        """
        if step == self.saved_step:
            return
        started = time.perf_counter()
        staging = staging_folder(self.backup_dir)
        model.save_weights(os.path.join(staging, WEIGHTS))
        values = [keras.ops.convert_to_numpy(v) for v in model.non_trainable_variables]
        with open(os.path.join(staging, NON_TRAINABLE), "wb") as handle:
            np.savez(handle, *values)
        positioned = stream is not None and not self.stream_settings.get("data_service")
        if positioned:
            stream.save(os.path.join(staging, STREAM))
        state = {
            "step": step,
            "stream": positioned,
            "stream_settings": self.stream_settings,
            "data_seed": self.data_seed,
            "callbacks": callbacks_state,
        }
        write_json(os.path.join(staging, STATE), state)
        _flush_folder(staging)
        final = os.path.join(self.backup_dir, f"step-{step:09d}")
        if os.path.exists(final):  # a backup of this step a killed run left: this one is whole
            _remove(final)
        os.replace(staging, final)
        keep = 2 if self.peers else 1  # a run of several keeps the step all may share
        for _, path in backup_folders(self.backup_dir)[:-keep]:
            _remove(path)
        self.saved_step = step
        self.save_seconds.append(time.perf_counter() - started)


def _remove(folder):
    """Removes a backup folder, first renaming it out of `step-N` (a kill leaves no half of it)."""
    doomed = staging_folder(os.path.dirname(folder))
    os.rmdir(doomed)
    os.replace(folder, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _flush_folder(folder):
    """Flushes a folder's files and the folder itself to disk (a host crash keeps them)."""
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as handle:
            os.fsync(handle.fileno())
    handle = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(handle)
    finally:
        os.close(handle)
