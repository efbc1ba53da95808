"""TensorFlow-only pipelines: data, training, serving, evaluation and the commands.

They come with the `tensorflow` extra: `pip install "keras-aiayn[tensorflow]"`.
"""

import importlib.util
import os

if importlib.util.find_spec("tensorflow") is None:
    raise ImportError(
        'pipelines need TensorFlow: pip install "keras-aiayn[tensorflow]" '
        "(keras_transformer itself needs only Keras and one backend)"
    )

# Everything under pipelines/ runs on TensorFlow (tf.data, tf.distribute).
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
