"""TF Serving's model layout: `BASE/NAME/VERSION/` with integer versions.

Kept free of Keras and of `keras_transformer`, so a process that only loads
SavedModels (`kt translate`) imports just TensorFlow.
"""

import os

from pipelines.errors import ExportError


def saved_versions(base_dir):
    """The integer version folders under `base_dir`, as ints (empty when none)."""
    if not os.path.isdir(base_dir):
        return []
    return [int(name) for name in os.listdir(base_dir) if name.isdigit()]


def next_version(base_dir):
    """1 + the largest integer version folder under `base_dir` (1 when none)."""
    return max(saved_versions(base_dir), default=0) + 1


def check_version(base_dir, version):
    """Raises `ExportError` unless `version` is None or a free non-negative integer.

    Args:
        base_dir: str, the model's folder (`BASE/NAME`).
        version: int or None (the next free version).
    """
    if version is None:
        return
    if version < 0:
        raise ExportError(f"--version must be a non-negative integer. Received: {version}")
    target = os.path.join(base_dir, str(version))
    if os.path.exists(target):
        raise ExportError(
            f"{target} already exists; choose another --version, or leave it out for "
            f"the next free one ({next_version(base_dir)})"
        )


def resolve_version(path):
    """A SavedModel folder: `path` itself, or its highest integer version.

    Raises:
        ExportError: when `path` holds neither `saved_model.pb` nor versions,
            or its newest version has no `saved_model.pb`.
    """
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    if not os.path.isdir(path):
        raise ExportError(f"--model: no such folder: {path}")
    versions = saved_versions(path)
    if not versions:
        raise ExportError(f"no SavedModel at {path} (expected saved_model.pb or NAME/VERSION/)")
    newest = os.path.join(path, str(max(versions)))
    if not os.path.isfile(os.path.join(newest, "saved_model.pb")):
        raise ExportError(broken_version_message(path, max(versions), "it has no saved_model.pb"))
    return newest


def broken_version_message(base_dir, version, reason):
    """Names a broken version folder and, when there is one, an older version to use."""
    message = f"the SavedModel {os.path.join(base_dir, str(version))} is broken: {reason}"
    older = sorted((v for v in saved_versions(base_dir) if v < version), reverse=True)
    for candidate in older:
        folder = os.path.join(base_dir, str(candidate))
        if os.path.isfile(os.path.join(folder, "saved_model.pb")):
            return f"{message}; an older version: --model {folder}"
    return message
