"""Training input streams whose position a backup saves, so a resume reads on in constant time.

A resumed run must train on the batches an uninterrupted run would have
read next. Reading past the batches the restored steps consumed costs time
in proportion to the step (about 1.5 hours at step 90,000 of `base`), so
the backup records where the stream stands instead, and a resume starts
reading there.

The position is tf.data's own iterator checkpoint (`tf.train.Checkpoint`
of the iterator): it holds the shuffle buffers, the length buckets' open
windows and the file readers' offsets, so the restored stream continues
exactly, whatever the pipeline's stages. Our own cursor (pass, shard,
record) would have to re-read a shuffle buffer's worth of examples and
re-fill every bucket to rebuild that state, and would tie resume to the
pipeline's current shape. The cost is the checkpoint's size, which grows
with the shuffle buffers, not with the step (`benchmarks/long_run.py`
measures it). tf.distribute's distributed iterators cannot be checkpointed
(TensorFlow 2.21), so every trainer reads a local iterator and places the
batches itself.
"""

import numpy as np
import tensorflow as tf


class TensorStream:
    """A tf.data iterator whose position can be saved and restored.

    Args:
        dataset: `tf.data.Dataset`, built the same way in the run that saves
            and the run that restores (same stages, seeds and settings).

    Example:
    >>> stream = TensorStream(tf.data.Dataset.range(10).shuffle(10, seed=1))
    >>> first = [int(next(stream)) for _ in range(3)]
    """

    def __init__(self, dataset):
        self.iterator = iter(dataset)
        self._checkpoint = tf.train.Checkpoint(iterator=self.iterator)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self.iterator)

    def save(self, prefix):
        """Writes the position to files starting with `prefix`."""
        self._checkpoint.write(prefix)

    def restore(self, prefix):
        """Moves the stream to the position saved under `prefix`."""
        self._checkpoint.read(prefix).assert_consumed()

    def skip(self, count):
        """Reads past `count` elements (a position older backups did not save)."""
        for _ in range(count):
            next(self.iterator)


def to_numpy(element):
    """A tf.data element's tensors as NumPy arrays."""
    return tf.nest.map_structure(np.asarray, element)


class MappedStream:
    """A stream (with `save`, `restore`, `skip`) whose elements are mapped as they are read.

    Args:
        stream: a `TensorStream`, or another stream such as `ProcessStream`.
        convert: callable applied to each element (`to_numpy`; JAX's placement).
    """

    def __init__(self, stream, convert):
        self.stream = stream
        self.convert = convert

    def __iter__(self):
        return self

    def __next__(self):
        return self.convert(next(self.stream))

    def save(self, prefix):
        self.stream.save(prefix)

    def restore(self, prefix):
        self.stream.restore(prefix)

    def skip(self, count):
        self.stream.skip(count)
