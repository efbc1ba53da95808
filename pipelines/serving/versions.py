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


def resolve_version(path):
    """A SavedModel folder: `path` itself, or its highest integer version.

    Raises:
        ExportError: when `path` holds neither `saved_model.pb` nor versions.
    """
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    versions = saved_versions(path)
    if not versions:
        raise ExportError(f"no SavedModel at {path} (expected saved_model.pb or NAME/VERSION/)")
    return os.path.join(path, str(max(versions)))
