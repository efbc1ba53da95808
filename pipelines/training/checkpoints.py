"""Checkpoints: loading, listing and averaging them (section 6.1)."""

import glob
import logging
import math
import os
import time
import zipfile

import keras
import numpy as np

import keras_transformer  # noqa: F401  registers the classes that .keras files name
from pipelines.errors import CheckpointError
from pipelines.files import atomic_output

logger = logging.getLogger(__name__)


def load_checkpoint(path, compile=False):
    """Loads a `.keras` file, naming the file when it cannot be used.

    Args:
        path: str, a `.keras` file written by training or averaging.
        compile: bool, restore the training configuration too.

    Returns:
        the `keras.Model`.

    Raises:
        CheckpointError: the file is missing or not a loadable Keras model.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"Cannot load checkpoint {path}: no such file")
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"Cannot load checkpoint {path}: the file is corrupt or truncated "
            "(not a .keras archive)"
        )
    try:
        return keras.saving.load_model(path, compile=compile)
    except TypeError as error:  # Keras's "Could not locate class ..."
        raise CheckpointError(
            f"Cannot load checkpoint {path}: it holds a model of classes this package does "
            f"not know ({error})"
        ) from None
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
        raise CheckpointError(
            f"Cannot load checkpoint {path}: the file is corrupt or truncated ({error})"
        ) from None


def with_dtype_policy(model, policy="float32"):
    """The model computing under another dtype policy, with the same weights.

    A model trained under `mixed_bfloat16` or `mixed_float16` keeps float32
    weights but records its policy in its config, so a loaded copy computes
    in the narrow type; an export for CPU serving wants float32, which every
    CPU runs at full speed and which decodes as the float32 reference search
    does. Keras has no call that changes a built model's policy, so this
    rebuilds the model from its config with `dtype=policy` and copies the
    weights (cast to the new variables' dtypes).

    Args:
        model: a built `keras.Model` whose config names its dtype policy (a
            `Transformer`, for one).
        policy: str or `keras.DTypePolicy`, the policy to compute under.

    Returns:
        `model` itself if it already computes under `policy`, else a new,
        built model (not compiled).
    """
    policy = keras.dtype_policies.get(policy)
    if model.dtype_policy.name == policy.name:
        return model
    config = model.get_config()
    config["dtype"] = policy.name
    copy = model.__class__.from_config(config)
    copy.build_from_config(model.get_build_config())
    copy.set_weights(model.get_weights())
    return copy


def average_checkpoints(paths, output_path):
    """Writes a model whose weights are the element-wise mean of the checkpoints'.

    Checkpoints are read one at a time into a running float64 sum, so memory
    holds two models whatever the number of checkpoints (20 checkpoints of
    `transformer_big` would otherwise be about 17 GB).

    Args:
        paths: list of str, `.keras` files of one architecture.
        output_path: str, the `.keras` file to write; it appears only once
            complete (a file already there is replaced only then).

    Returns:
        the averaged `keras.Model` (not compiled).

    Raises:
        CheckpointError: no paths, an unreadable file, or another architecture.
    """
    if not paths:
        raise CheckpointError("No checkpoints to average")
    averaged = load_checkpoint(paths[0])
    # float64 sums: averaging many checkpoints adds no rounding of its own.
    sums = [np.asarray(w, np.float64) for w in averaged.get_weights()]
    shapes = [w.shape for w in sums]
    started = time.perf_counter()
    for done, path in enumerate(paths[1:], start=2):
        weights = load_checkpoint(path).get_weights()
        if [w.shape for w in weights] != shapes:
            raise CheckpointError(f"{path} does not have the architecture of {paths[0]}")
        for total, weight in zip(sums, weights, strict=True):
            total += weight
        seconds = (time.perf_counter() - started) / (done - 1)
        left = seconds * (len(paths) - done)
        logger.info("Averaged %d of %d checkpoints, about %.0f s left", done, len(paths), left)
    averaged.set_weights(
        [
            (total / len(paths)).astype(w.dtype)
            for total, w in zip(sums, averaged.weights, strict=True)
        ]
    )
    with atomic_output(output_path, suffix=".keras") as staging:
        averaged.save(staging)
    return averaged


def epoch_checkpoints(checkpoint_dir):
    """A run's checkpoints, oldest first: `epoch-N.keras` by N, then `step-N.keras` by N.

    Ordered by N, not by name: names are padded to three digits, so a run of
    more than 999 epochs has `epoch-1000.keras` after `epoch-999.keras`,
    where a name sort would put it among the first. A run writes one kind:
    epoch checkpoints, or with `checkpoint_minutes` checkpoints named by step.

    Args:
        checkpoint_dir: str, the run's `checkpoints` folder.

    Returns:
        list of str paths.
    """
    numbered = []
    for kind, prefix in enumerate(("epoch-", "step-")):
        for path in glob.glob(os.path.join(checkpoint_dir, f"{prefix}*.keras")):
            number = os.path.basename(path)[len(prefix) : -len(".keras")]
            if number.isdigit():
                numbered.append((kind, int(number), path))
    return [path for _, _, path in sorted(numbered)]


def checkpoints_to_average(checkpoints, output):
    """The newest epoch checkpoints that `model.keras` averages (section 6.1).

    `average_last` of them, or `average_share` of all of them (rounded up) if
    that is more: a time-budgeted run trains as many epochs as the machine
    allows, and a share averages the same part of the run on any machine.

    Args:
        checkpoints: list of str, the run's epoch checkpoints, oldest first.
        output: a training config's `OutputConfig` (`average_last`, `average_share`).

    Returns:
        list of str, the newest of `checkpoints`, oldest first.
    """
    share = round(output.average_share * len(checkpoints), 6)  # 0.28 * 25 is 7.000000000000001
    count = max(output.average_last, math.ceil(share))
    return checkpoints[-count:]
