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


def shared_data(name):
    """`../shared/data/NAME`, or the calling test skipped when it is not there."""
    path = os.path.abspath(os.path.join(SHARED, "data", name))
    if not os.path.isdir(path):
        pytest.skip(f"{name} not found at {path}")
    return path


@pytest.fixture
def multi30k_dir():
    return shared_data("multi30k")


def two_cpus():
    return len(tf.config.list_logical_devices("CPU")) >= 2


def tiny_translation_model(root, vocabulary_size, seed=0, **model_arguments):
    """A SentencePiece model trained on the default corpus and an untrained Transformer.

    Returns:
        `(model, sentencepiece_path)`; the model is built.
    """
    import keras
    import numpy as np

    from keras_transformer import Transformer
    from pipelines.data.default_corpus import generate_pairs
    from pipelines.data.tokenizer import train_sentencepiece

    spm_path = str(root / "sentencepiece.model")
    pairs = generate_pairs(800, seed=seed)
    train_sentencepiece([text for pair in pairs for text in pair], spm_path, vocabulary_size)
    keras.utils.set_random_seed(seed)
    model = Transformer(vocabulary_size=vocabulary_size, **model_arguments)
    model((np.ones((1, 4), "int32"), np.ones((1, 4), "int32")))
    return model, spm_path
