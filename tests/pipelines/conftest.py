"""Pipeline tests run on TensorFlow with the CPU split into two logical devices.

The split must happen before TensorFlow initializes its devices, so it is done
when pytest first imports this package's tests.
"""

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402

try:
    tf.config.set_logical_device_configuration(
        tf.config.list_physical_devices("CPU")[0],
        [tf.config.LogicalDeviceConfiguration()] * 2,
    )
except RuntimeError:  # devices already initialized by an earlier test module
    pass

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared")
MULTI30K = os.path.abspath(os.path.join(SHARED, "data", "multi30k"))


@pytest.fixture
def multi30k_dir():
    if not os.path.isdir(MULTI30K):
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    return MULTI30K


def two_cpus():
    return len(tf.config.list_logical_devices("CPU")) >= 2
