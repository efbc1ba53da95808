"""TensorFlow-only pipelines: data, tokenization, distributed training, evaluation."""

import os

# Everything under pipelines/ runs on TensorFlow (tf.data, tf.distribute).
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
