"""Checks of a request's per-sentence inputs, in the graph: one row a sentence, and rows refused.

A signature's extra inputs are batch-major (`(B,)`, one value a sentence), so
TF Serving's batcher can merge requests; these checks fail a request whose
rows do not line up, or name the rows whose values are refused.
"""

import tensorflow as tf


def check_rows(inputs, **others):
    """Fails a request whose tensors `others` are not shaped like `inputs` `(B,)`, one row each."""
    for name, tensor in others.items():
        tf.debugging.assert_equal(
            tf.shape(tensor), tf.shape(inputs), message=f"one {name} row per input sentence"
        )


def refuse_rows(bad, message):
    """Fails the request, naming the rows where `bad` `(B,)` holds, if any does."""
    rows = tf.where(bad)[:, 0]
    tf.debugging.Assert(tf.equal(tf.size(rows), 0), [message, rows], summarize=20)
