"""Tokenized training data on disk: written once, in parallel, in random order; read by shard.

A corpus of any size is tokenized once into shard files whose examples are
in random order, so training reads a shuffled list of shards, interleaved,
through a bounded shuffle buffer, and a corpus sorted by source or by
sub-corpus still trains on well-mixed batches (the approach of
tensor2tensor's shuffled shards). Memory is bounded by settings: a part of
`PART_LINES` lines in flight, then one shard in memory while it is shuffled.

Preparation, by the chief alone (`prepare_shards`):
  1. each part of `PART_LINES` lines of each corpus is tokenized by
     SentencePiece's own encoder on every core (its `num_threads`; BPE-dropout
     copies too) and each example goes to a random bucket
     file of the part; the part's `done.json` (records per bucket) marks it
     complete;
  2. bucket N of every part is gathered into shard N, shuffled in memory and
     written under a temporary name, then renamed: a shard file is complete;
  3. `manifest.json`, written last, lists every shard with its records and
     bytes. Readers trust only a manifest whose files all have their listed
     sizes (`read_manifest`), so a killed preparation is never trained on,
     and a rerun redoes only the parts and shards not yet complete.

Why SentencePiece's encoder rather than tensorflow-text's in a parallel
tf.data `map`: on 2 cores the in-graph tokenizer reached 0.69x the
encoder's pairs a second, and 0.48x when fed from the Python reader, where
the encoder's own threads with the reading and writing around them reach
0.95-1.05x. The two give the same ids from the same model file (tested),
and the encoder takes a seed: BPE-dropout copies are reproducible on one
core (on several, its threads take the sentences in no fixed order).

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

import collections
import itertools
import json
import logging
import os
import shutil
import time

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from pipelines.data.corpus import nonempty
from pipelines.data.scan import PROGRESS_SECONDS, Progress
from pipelines.data.tokenizer import BOS_ID, EOS_ID
from pipelines.errors import DataError
from pipelines.files import atomic_output, write_json

logger = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
# Lines tokenized as one resumable part.
PART_LINES = 1_000_000
# Sentences an encoder call takes: one call per chunk is far faster than per sentence.
CHUNK = 1024
# Shard files read at once by a training stream.
CYCLE_LENGTH = 16
MANIFEST = "manifest.json"
FORMAT = 1


def record_dtype(vocabulary_size):
    """`"uint16"` when every id and length fits in 16 bits, else `"int32"`."""
    return "uint16" if vocabulary_size <= 2**16 else "int32"


def shard_name(corpus, shard):
    return f"shard-{corpus:02d}-{shard:05d}.tfrecord"


def _part_folder(folder, corpus, copy, part):
    return os.path.join(folder, "parts", f"{corpus:02d}-{copy:02d}-{part:05d}")


def _bucket_path(part_folder, bucket):
    return os.path.join(part_folder, f"bucket-{bucket:05d}.tfrecord")


# Longer lines are left out: their pieces could overflow a record's uint16 length, and no
# `max_length` a model trains with comes near (SentencePiece's pieces hold up to 16 characters).
MAX_CHARACTERS = 2**15 - 1


def _chunks(lines):
    """`(sources, targets)` lists of `CHUNK` non-empty pairs of the line pairs `lines`."""
    pairs = (
        (s, t) for s, t in nonempty(lines) if len(s) <= MAX_CHARACTERS and len(t) <= MAX_CHARACTERS
    )
    while chunk := list(itertools.islice(pairs, CHUNK)):
        yield [s for s, _ in chunk], [t for _, t in chunk]


def _flat(lists):
    """`(ids, lengths)`: a list of id lists as one flat array and each list's length."""
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))
    ids = np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(lengths.sum()))
    return ids, lengths


def _tokenized_chunks(lines, encoder, seeds):
    """Tokenized chunks of the line pairs `lines`: flat ids and lengths of each side.

    Args:
        lines: iterator of `(source, target)` str pairs.
        encoder: `Encoder`.
        seeds: `numpy.random.SeedSequence`, the part's: chunk `k` samples
            with seeds spawned from it (used only by BPE-dropout).
    """
    for index, (sources, targets) in enumerate(_chunks(lines)):
        source_seed, target_seed = np.random.SeedSequence([*seeds.entropy, index]).generate_state(2)
        yield (
            *_flat(encoder(sources, int(source_seed))),
            *_flat(encoder(targets, int(target_seed))),
        )


class Encoder:
    """SentencePiece's encoder on every core: `encoder(sentences, seed)` -> id lists.

    With `alpha`, each call samples a BPE-dropout segmentation (each merge
    skipped with probability `alpha`) from `seed`: sentencepiece's sampler
    restarts from its global seed at every call, so a call on one thread is
    reproducible; with several, the threads take the sentences in no fixed
    order and the samples vary (a resumed preparation redoes only its
    incomplete parts, and training reads the copies saved).

    Args:
        model_path: str, a SentencePiece `.model` file.
        alpha: float, BPE-dropout's probability (0: the deterministic segmentation).
        threads: int or None, encoder threads (None: the cores this process may use).
    """

    def __init__(self, model_path, alpha=0.0, threads=None):
        self.processor = spm.SentencePieceProcessor(model_file=model_path)
        self.alpha = alpha
        self.threads = threads or len(os.sched_getaffinity(0))

    def __call__(self, sentences, seed=0):
        if not self.alpha:
            return self.processor.encode(sentences, num_threads=self.threads)
        spm.set_random_generator_seed(seed)
        return self.processor.encode(
            sentences,
            enable_sampling=True,
            alpha=self.alpha,
            nbest_size=-1,
            num_threads=self.threads,
        )


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


def decode_record(dtype):
    """A function from a record to `{"source": ids + [EOS], "target": [BOS] + ids + [EOS]}`."""
    tf_dtype = tf.as_dtype(dtype)

    def decode(record):
        values = tf.cast(tf.io.decode_raw(record, tf_dtype, little_endian=True), tf.int32)
        length = values[0] + 1
        return {
            "source": tf.concat([values[1:length], [EOS_ID]], axis=0),
            "target": tf.concat([[BOS_ID], values[length:], [EOS_ID]], axis=0),
        }

    return decode


class _Writer:
    """Bucket files of one part, written under temporary names until `close`."""

    def __init__(self, folder, buckets):
        self.folder = folder
        self.staging = folder + ".incomplete"
        shutil.rmtree(self.staging, ignore_errors=True)
        os.makedirs(self.staging)
        self.writers = [tf.io.TFRecordWriter(_bucket_path(self.staging, b)) for b in range(buckets)]
        self.counts = [0] * buckets

    def write(self, records, buckets):
        for record, bucket in zip(records, buckets, strict=True):
            self.writers[bucket].write(record)
            self.counts[bucket] += 1

    def close(self, summary):
        for writer in self.writers:
            writer.close()
        write_json(os.path.join(self.staging, "done.json"), {"records": self.counts, **summary})
        os.replace(self.staging, self.folder)


def _write_part(lines, index, copy, part, plan, encoder, folder, progress):
    """Pass 1 for one part: its `lines` tokenized into random bucket files, then `done.json`."""
    buckets = plan["shards"][index]
    seeds = np.random.SeedSequence([plan["seed"], index, copy, part])
    rng = np.random.default_rng(seeds)
    writer = _Writer(_part_folder(folder, index, copy, part), buckets)
    tokens = np.zeros(2, np.int64)
    for chunk in _tokenized_chunks(lines, encoder, seeds):
        records = encode_records(*chunk, plan["dtype"])
        writer.write(records, rng.integers(buckets, size=len(records)))
        tokens += (len(chunk[0]), len(chunk[2]))
        progress.update(len(records))
    writer.close({"source_tokens": int(tokens[0]), "target_tokens": int(tokens[1])})


def _parts(folder, index, plan):
    """Corpus `index`'s part folders, a list for each copy."""
    parts = range(-(-plan["lines"][index] // PART_LINES))
    return [
        [_part_folder(folder, index, copy, part) for part in parts]
        for copy in range(plan["copies"])
    ]


def _done_parts(folder, index, plan):
    return [part for copy in _parts(folder, index, plan) for part in copy]


def _write_shard(folder, index, shard, plan):
    """Pass 2 for one shard: bucket `shard` of every part, shuffled, renamed into place."""
    parts = _done_parts(folder, index, plan)
    files = [_bucket_path(p, shard) for p in parts]
    expected = 0
    for part in parts:
        with open(os.path.join(part, "done.json"), encoding="utf-8") as handle:
            expected += json.load(handle)["records"][shard]
    records = [
        record
        for batch in tf.data.TFRecordDataset(files).batch(4096).as_numpy_iterator()
        for record in batch
    ]
    if len(records) != expected:
        raise DataError(
            f"{folder}: shard {shard} of corpus {index} has {len(records)} records where its "
            f"parts wrote {expected}: remove {folder} and prepare again"
        )
    order = np.random.default_rng([plan["seed"], index, shard, 2]).permutation(len(records))
    path = os.path.join(folder, shard_name(index, shard))
    with atomic_output(path) as staging:
        with tf.io.TFRecordWriter(staging) as writer:
            for i in order:
                writer.write(records[i])
    for file in files:
        os.remove(file)
    return {"file": shard_name(index, shard), "records": expected, "bytes": os.path.getsize(path)}


def plan_shards(pairs, copies, shard_size, min_shards):
    """Shards per corpus: `ceil(pairs * copies / shard_size)`, at least `min_shards`.

    Args:
        pairs: list of int, each corpus's non-empty pairs.
        copies: int, segmentations of each pair written (BPE-dropout copies).
        shard_size: int, examples a shard holds about.
        min_shards: int, shards per corpus at least (a training stream per
            worker needs one of its own).

    Returns:
        list of int.
    """
    return [max(-(-n * copies // shard_size), min_shards, 1) for n in pairs]


def prepare_shards(corpora, folder, spm_path, plan, alpha=0.0, threads=None):
    """Tokenizes `corpora` into shuffled shards under `folder` and writes the manifest.

    Resumable: parts and shards already complete are kept; a part left
    incomplete by a kill is redone. Logs progress (pairs done, pairs a
    second, time left) every `PROGRESS_SECONDS`.

    Args:
        corpora: list of `Corpus`, in the plan's order.
        folder: str, the output folder (created).
        spm_path: str, the SentencePiece model file.
        plan: dict with int lists `lines`, `pairs`, `shards` (per corpus),
            float list `shares`, ints `seed` and `copies`, str `dtype`, and
            dict `identity` (what the manifest must match on a rerun).
        alpha: float, BPE-dropout's probability of skipping a merge (0: the
            deterministic segmentation, one copy).
        threads: int or None, encoder threads (None: every core this
            process may use).

    Returns:
        dict, the manifest (see `read_manifest`).
    """
    started = time.monotonic()
    encoder = Encoder(spm_path, alpha, threads)
    os.makedirs(folder, exist_ok=True)
    for index, corpus in enumerate(corpora):
        total = plan["pairs"][index] * plan["copies"]
        progress = Progress(f"Tokenizing {corpus.name}", total)
        for copy in range(plan["copies"]):
            # One stream a copy, its parts read one after another; a resumed preparation
            # reads past the complete parts up to the last incomplete one.
            parts = _parts(folder, index, plan)[copy]
            done = [os.path.exists(os.path.join(p, "done.json")) for p in parts]
            lines = corpus.lines()
            for part, part_folder in enumerate(parts):
                part_lines = itertools.islice(lines, PART_LINES)
                if done[part]:
                    progress.update(_part_records(part_folder))
                    if not all(done[part:]):
                        collections.deque(part_lines, maxlen=0)
                    continue
                _write_part(part_lines, index, copy, part, plan, encoder, folder, progress)
        logger.info("%s", progress.line())
    tokenized = time.monotonic() - started
    corpora_entries = []
    for index, corpus in enumerate(corpora):
        shards = []
        logger.info("Shuffling %d shards of %s", plan["shards"][index], corpus.name)
        for shard in range(plan["shards"][index]):
            path = os.path.join(folder, shard_name(index, shard))
            if os.path.exists(path):  # renamed into place complete
                shards.append(_shard_entry(folder, index, shard))
            else:
                shards.append(_write_shard(folder, index, shard, plan))
        corpora_entries.append(
            {"name": corpus.name, "share": plan["shares"][index], "shards": shards}
        )
    summaries = [
        _summary(folder, index, plan, entry) for index, entry in enumerate(corpora_entries)
    ]
    manifest = {
        "format": FORMAT,
        "identity": plan["identity"],
        "dtype": plan["dtype"],
        "corpora": summaries,
        "seconds": {
            "tokenizing": round(tokenized, 1),
            "shuffling": round(time.monotonic() - started - tokenized, 1),
        },
    }
    write_json(os.path.join(folder, MANIFEST), manifest)
    shutil.rmtree(os.path.join(folder, "parts"), ignore_errors=True)
    return manifest


def _part_records(part_folder):
    with open(os.path.join(part_folder, "done.json"), encoding="utf-8") as handle:
        return sum(json.load(handle)["records"])


def _shard_entry(folder, index, shard):
    path = os.path.join(folder, shard_name(index, shard))
    records = sum(1 for _ in tf.data.TFRecordDataset(path).batch(4096).unbatch())
    return {"file": shard_name(index, shard), "records": records, "bytes": os.path.getsize(path)}


def _summary(folder, index, plan, entry):
    """A corpus's manifest entry: its shards, examples and tokens."""
    tokens = np.zeros(2, np.int64)
    for part in _done_parts(folder, index, plan):
        with open(os.path.join(part, "done.json"), encoding="utf-8") as handle:
            done = json.load(handle)
        tokens += (done["source_tokens"], done["target_tokens"])
    return {
        **entry,
        "lines": plan["lines"][index],
        "pairs": plan["pairs"][index],
        "examples": sum(s["records"] for s in entry["shards"]),
        "source_tokens": int(tokens[0]),
        "target_tokens": int(tokens[1]),
    }


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
        DataError: a complete preparation of other data or settings.
    """
    path = os.path.join(folder, MANIFEST)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        manifest = json.load(handle)
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


def wait_for_file(path, poll_seconds=5.0, clock=time.monotonic, sleep=time.sleep):
    """Waits until `path` exists (a worker waiting for the chief's data); returns it.

    A line is logged every `PROGRESS_SECONDS` while it waits.
    """
    started = last = clock()
    while not os.path.exists(path):
        if clock() - last >= PROGRESS_SECONDS:
            last = clock()
            logger.info("Waiting for the chief's %s (%.0f s)", path, last - started)
        sleep(poll_seconds)
    return path


def wait_for_manifest(folder, identity):
    """The manifest of `folder` once complete (see `read_manifest`), waiting for it."""
    while (manifest := read_manifest(folder, identity)) is None:
        wait_for_file(os.path.join(folder, MANIFEST))
        time.sleep(1.0)  # complete but not verified yet: a shard still being renamed
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
    decode = decode_record(manifest["dtype"])
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
