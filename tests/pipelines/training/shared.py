"""What the training tests of both backends share (tests/jax_training imports it too)."""

import numpy as np
import tensorflow as tf

# `kt train` flags for a run of seconds: the default recipe, shrunk.
TINY = [
    "--set", "default_corpus_sizes=[1500,40,40]",
    "--set", "model.num_layers=1",
    "--set", "model.hidden_dim=32",
    "--set", "model.intermediate_dim=64",
    "--batch-tokens", "512",
    "--vocabulary-size", "200",
    "--input-streams", "1",  # the same stream whatever the machine's cores
]  # fmt: skip


def varied_examples():
    """48 cached id examples of six lengths: batches of several shapes, the same every time."""
    rng = np.random.default_rng(0)
    examples = tf.data.Dataset.from_generator(
        lambda: (
            {"source": rng.integers(4, 30, n).astype("int32"),
             "target": rng.integers(4, 30, n + 2).astype("int32")}
            for n in [3, 4, 5, 6, 7, 8] * 8
        ),
        output_signature={"source": tf.TensorSpec([None], tf.int32),
                          "target": tf.TensorSpec([None], tf.int32)},
    ).cache()  # fmt: skip
    list(examples)  # fills the cache from the generator once
    return examples
