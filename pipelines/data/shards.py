"""Prepared training data: shard files of examples in random order, their manifest, reading them.

A corpus of any size is tokenized once (`pipelines.data.preparation`) into
shard files whose examples are in random order, so training reads a
shuffled list of shards, interleaved, through a bounded shuffle buffer, and
a corpus sorted by source or by sub-corpus still trains on well-mixed
batches (the approach of tensor2tensor's shuffled shards).

A folder of prepared data holds `shard-CC-NNNNN.tfrecord` files and
`manifest.json`, written last, which lists every shard with its records and
bytes. Readers trust only a manifest whose files all have their listed sizes
(`read_manifest`), so a preparation that was killed is never trained on.

Why TFRecord files of raw ids, rather than `tf.data.Dataset.save` or memory-
mapped arrays: `save` writes its own shard files in one go and `load` reads
them back nearly in corpus order, with no way to resume a part or to name
the files a worker reads; memory-mapped arrays would be read through Python
(`from_generator`), one thread. TFRecord files are plain files we name,
count, shuffle and check, and tf.data reads them in parallel C++ threads.
A record is one example: its source length then the source and target
piece ids, without BOS and EOS, little-endian uint16 where the vocabulary
fits (half of int32 on disk and in reading), else int32.
"""

import json
import logging
import os

import numpy as np
import tensorflow as tf

from pipelines.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from pipelines.errors import DataError

logger = logging.getLogger(__name__)


AUTOTUNE = tf.data.AUTOTUNE


# Shard files read at once by a training stream.
CYCLE_LENGTH = 16


MANIFEST = "manifest.json"


FORMAT = 1


def record_dtype(vocabulary_size):
    """`"uint16"` when every id and length fits in 16 bits, else `"int32"`."""
    return "uint16" if vocabulary_size <= 2**16 else "int32"


def shard_name(corpus, shard):
    return f"shard-{corpus:02d}-{shard:05d}.tfrecord"


def encode_records(source_ids, source_lengths, target_ids, target_lengths, dtype):
    """Packs a chunk of tokenized pairs into records: `[S, source..., target...]` each.

    Args:
        source_ids, target_ids: int arrays, every pair's ids one after another.
        source_lengths, target_lengths: int arrays `(n,)`, each pair's lengths.
        dtype: "uint16" or "int32".

    Returns:
        list of `n` bytes objects.
    """
    n = len(source_lengths)
    lengths = 1 + source_lengths + target_lengths
    ends = np.cumsum(lengths)
    starts = ends - lengths
    flat = np.empty(int(ends[-1]) if n else 0, np.dtype(dtype).newbyteorder("<"))
    flat[starts] = source_lengths
    for ids, row_lengths, offset in (
        (source_ids, source_lengths, starts + 1),
        (target_ids, target_lengths, starts + 1 + source_lengths),
    ):
        first = np.repeat(offset - np.cumsum(row_lengths) + row_lengths, row_lengths)
        flat[first + np.arange(len(ids))] = ids
    data, size = flat.tobytes(), flat.itemsize
    return [data[a * size : b * size] for a, b in zip(starts, ends, strict=True)]


def special_ids(manifest):
    """The `pad_id`, `bos_id` and `eos_id` a manifest's examples are written with.

    A run's vocabulary sets them (an imported Marian model's differ from
    ours); manifests that do not list them were written with ours.
    """
    ids = {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID}
    return {**ids, **manifest.get("special_ids", {})}


def decode_record(dtype, bos_id=BOS_ID, eos_id=EOS_ID):
    """A function from a record to `{"source": ids + [EOS], "target": [BOS] + ids + [EOS]}`."""
    tf_dtype = tf.as_dtype(dtype)

    def decode(record):
        values = tf.cast(tf.io.decode_raw(record, tf_dtype, little_endian=True), tf.int32)
        length = values[0] + 1
        return {
            "source": tf.concat([values[1:length], [eos_id]], axis=0),
            "target": tf.concat([[bos_id], values[length:], [eos_id]], axis=0),
        }

    return decode


def read_manifest(folder, identity=None):
    """The manifest of a complete preparation in `folder`, or None.

    Complete means: the manifest exists and every shard it lists exists with
    the listed size in bytes.

    Args:
        folder: str, a folder `prepare_shards` wrote.
        identity: dict or None, what the manifest must have been prepared
            from (None: anything).

    Returns:
        dict, the manifest: `dtype`, `identity`, `seconds`, and `corpora`,
        each with `name`, `share`, `lines`, `pairs`, `examples`, token counts
        and `shards` (`file`, `records`, `bytes`); or None if incomplete.

    Raises:
        DataError: a complete preparation of other data or settings, or of
            another `FORMAT`.
    """
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        manifest = json.load(handle)
    if manifest.get("format") != FORMAT:
        raise DataError(
            f"{folder}: prepared in format {manifest.get('format')}, and this version reads "
            f"format {FORMAT}: remove that folder to prepare it again, or train into a new "
            "output_dir"
        )
    for corpus in manifest["corpora"]:
        for shard in corpus["shards"]:
            file = os.path.join(folder, shard["file"])
            if not os.path.exists(file) or os.path.getsize(file) != shard["bytes"]:
                logger.warning("%s: %s is missing or of another size", folder, shard["file"])
                return None
    if identity is not None and manifest["identity"] != identity:
        differing = [
            key
            for key in sorted(set(identity) | set(manifest["identity"]))
            if identity.get(key) != manifest["identity"].get(key)
        ]
        raise DataError(
            f"{folder} holds data prepared from other settings ({', '.join(differing)}): "
            "train into a new output_dir, or remove that folder to prepare it again"
        )
    return manifest


def read_examples(manifest, folder, shuffle=False, seed=0, pipeline=0, pipelines=1):
    """The examples of a prepared folder as tf.data, each corpus by its share.

    With `shuffle`, each corpus's shard list is shuffled anew each pass and
    `CYCLE_LENGTH` shards are read interleaved, every corpus repeats forever,
    and corpora are drawn by their shares (`sample_from_datasets`); a
    stream with one corpus ends after its pass (`batch_examples(repeat=True)`
    starts the next with another shard order). Without it, shards are read
    in order, once.

    Args:
        manifest: dict, from `read_manifest`.
        folder: str, the prepared folder.
        shuffle: bool, a training stream (see above).
        seed: int, the shuffling and mixing seed.
        pipeline, pipelines: int, this input pipeline (worker) and their
            number: it reads every `pipelines`-th shard of each corpus,
            starting at `pipeline`.

    Returns:
        `tf.data.Dataset` of dicts of int32 `source` `(S,)` (ending in EOS)
        and `target` `(T + 1,)` (BOS, pieces, EOS).
    """
    ids = special_ids(manifest)
    decode = decode_record(manifest["dtype"], ids["bos_id"], ids["eos_id"])
    streams = []
    for corpus in manifest["corpora"]:
        files = [os.path.join(folder, s["file"]) for s in corpus["shards"]][pipeline::pipelines]
        if len(corpus["shards"]) < pipelines:
            raise DataError(
                f"{folder}: corpus {corpus['name']} has {len(corpus['shards'])} shards, "
                f"fewer than the {pipelines} input pipelines: prepare it again"
            )
        names = tf.data.Dataset.from_tensor_slices(files)
        if shuffle:
            names = names.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        records = names.interleave(
            tf.data.TFRecordDataset,
            cycle_length=min(CYCLE_LENGTH, len(files)),
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )
        streams.append(records.map(decode, num_parallel_calls=AUTOTUNE, deterministic=True))
    if len(streams) == 1:
        return streams[0]
    if not shuffle:
        return _concatenate(streams)
    weights = [corpus["share"] for corpus in manifest["corpora"]]
    return tf.data.Dataset.sample_from_datasets(
        [s.repeat() for s in streams], weights=weights, seed=seed
    )


def _concatenate(streams):
    joined = streams[0]
    for stream in streams[1:]:
        joined = joined.concatenate(stream)
    return joined
