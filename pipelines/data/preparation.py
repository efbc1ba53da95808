"""Preparing training data: a corpus tokenized once, in parallel, into shards in random order.

By the chief alone (`prepare_shards`), with memory bounded by settings (a
part of `PART_LINES` lines in flight, then one shard in memory while it is
shuffled):
  1. each part of `PART_LINES` lines of each corpus is tokenized by
     SentencePiece's own encoder on every core (its `num_threads`;
     BPE-dropout copies too) and each example goes to a random bucket file
     of the part; the part's `done.json` (records per bucket) marks it
     complete;
  2. bucket N of every part is gathered into shard N, shuffled in memory and
     written under a temporary name, then renamed: a shard file is complete;
  3. the manifest, written last (`pipelines.data.shards`).
A rerun redoes only the parts and shards not yet complete.

Why SentencePiece's encoder rather than tensorflow-text's in a parallel
tf.data `map`: the in-graph tokenizer, fed from the Python reader, was
measured at half the encoder's pairs a second on 2 cores
(benchmarks/studies/corpus-scale.md). The two give the
same ids from the same model file (tested), and the encoder takes a seed:
BPE-dropout copies are reproducible on one core (on several, its threads
take the sentences in no fixed order).
"""

import collections
import itertools
import json
import logging
import os
import resource
import shutil
import time

import numpy as np
import sentencepiece as spm
import tensorflow as tf

from pipelines.data.corpus import trainable
from pipelines.data.progress import Progress
from pipelines.data.shards import FORMAT, MANIFEST, encode_records, read_manifest, shard_name
from pipelines.data.vocabularies import target_vocabulary_path
from pipelines.errors import DataError
from pipelines.files import atomic_output, staging_folder, write_json

logger = logging.getLogger(__name__)

# Lines tokenized as one resumable part.
PART_LINES = 1_000_000


# Sentences an encoder call takes: one call per chunk is far faster than per sentence.
CHUNK = 1024


def _part_folder(folder, corpus, copy, part):
    return os.path.join(folder, "parts", f"{corpus:02d}-{copy:02d}-{part:05d}")


def _bucket_path(part_folder, bucket):
    return os.path.join(part_folder, f"bucket-{bucket:05d}.tfrecord")


def _chunks(lines):
    """`(sources, targets)` lists of `CHUNK` pairs of `lines` that training reads."""
    pairs = trainable(lines)
    while chunk := list(itertools.islice(pairs, CHUNK)):
        yield [s for s, _ in chunk], [t for _, t in chunk]


def _flat(lists):
    """`(ids, lengths)`: a list of id lists as one flat array and each list's length."""
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))
    ids = np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(lengths.sum()))
    return ids, lengths


def _tokenized_chunks(lines, encoders, seeds):
    """Tokenized chunks of the line pairs `lines`: flat ids and lengths of each side.

    Args:
        lines: iterator of `(source, target)` str pairs.
        encoders: `(source, target)` `Encoder`s (one object where one
            vocabulary serves both sides).
        seeds: `numpy.random.SeedSequence`, the part's: chunk `k` samples
            with seeds spawned from it (used only by BPE-dropout).
    """
    for index, (sources, targets) in enumerate(_chunks(lines)):
        source_seed, target_seed = np.random.SeedSequence([*seeds.entropy, index]).generate_state(2)
        yield (
            *_flat(encoders[0](sources, int(source_seed))),
            *_flat(encoders[1](targets, int(target_seed))),
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
        usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
        self.threads = threads or (len(usable) if usable else os.cpu_count())

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


class _Writer:
    """Bucket files of one part, written in a staging folder renamed into place at `close`."""

    def __init__(self, folder, buckets):
        self.folder = folder
        self.staging = staging_folder(os.path.dirname(folder))  # a dead writer's is removed
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


def _write_part(lines, index, copy, part, plan, encoders, folder, progress):
    """Pass 1 for one part: its `lines` tokenized into random bucket files, then `done.json`."""
    buckets = plan["shards"][index]
    seeds = np.random.SeedSequence([plan["seed"], index, copy, part])
    rng = np.random.default_rng(seeds)
    writer = _Writer(_part_folder(folder, index, copy, part), buckets)
    tokens = np.zeros(2, np.int64)
    for chunk in _tokenized_chunks(lines, encoders, seeds):
        records = encode_records(*chunk, plan["dtype"])
        writer.write(records, rng.integers(buckets, size=len(records)))
        tokens += (len(chunk[0]), len(chunk[2]))
        progress.update(len(records))
    writer.close({"source_tokens": int(tokens[0]), "target_tokens": int(tokens[1])})


def _read_done(part_folder):
    with open(os.path.join(part_folder, "done.json"), encoding="utf-8") as handle:
        return json.load(handle)


def _part_summaries(folder, index, plan):
    """The `done.json` of every part of corpus `index`: records per bucket, tokens."""
    return [_read_done(part) for part in _all_parts(folder, index, plan)]


def _parts(folder, index, plan):
    """Corpus `index`'s part folders, a list for each copy."""
    parts = range(-(-plan["lines"][index] // PART_LINES))
    return [
        [_part_folder(folder, index, copy, part) for part in parts]
        for copy in range(plan["copies"])
    ]


def _all_parts(folder, index, plan):
    return [part for copy in _parts(folder, index, plan) for part in copy]


def _write_shard(folder, index, shard, plan, summaries):
    """Pass 2 for one shard: bucket `shard` of every part, shuffled, renamed into place."""
    files = [_bucket_path(p, shard) for p in _all_parts(folder, index, plan)]
    expected = sum(summary["records"][shard] for summary in summaries)
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


def plan_shards(pairs, copies, shard_size, pipelines):
    """Shards per corpus: about `pairs * copies / shard_size`, a multiple of `pipelines`.

    Every input pipeline (a worker's or process's stream) then reads as many
    shards of each corpus as every other, so none sees its examples at
    another rate.

    Args:
        pairs: list of int, each corpus's non-empty pairs.
        copies: int, segmentations of each pair written (BPE-dropout copies).
        shard_size: int, examples a shard holds about.
        pipelines: int, the input pipelines that will share the shards.

    Returns:
        list of int.
    """
    shards = [max(-(-n * copies // shard_size), 1) for n in pairs]
    return [-(-count // pipelines) * pipelines for count in shards]


def prepare_shards(corpora, folder, spm_path, plan, alpha=0.0, threads=None):
    """Tokenizes `corpora` into shuffled shards under `folder` and writes the manifest.

    Resumable: a complete preparation of the same identity is kept whole,
    and otherwise the parts and shards already complete; a part left
    incomplete by a kill is redone. Logs progress (pairs done, pairs a
    second, time left) every `PROGRESS_SECONDS`.

    Args:
        corpora: list of `Corpus`, in the plan's order.
        folder: str, the output folder (created).
        spm_path: str, the SentencePiece model file (the source side's where
            the run has one a side, see `target_vocabulary_path`).
        plan: dict with int lists `lines`, `pairs`, `shards` (per corpus),
            float list `shares`, ints `seed` and `copies`, str `dtype`, and
            dict `identity` (what the manifest must match on a rerun).
        alpha: float, BPE-dropout's probability of skipping a merge (0: the
            deterministic segmentation, one copy).
        threads: int or None, encoder threads (None: every core this
            process may use).

    Returns:
        dict, the manifest (see `read_manifest`); that of a complete
        preparation of the same identity already in `folder`, as it is.
    """
    manifest = read_manifest(folder)
    if manifest is not None and manifest["identity"] == plan["identity"]:
        return manifest
    started = time.monotonic()
    _begin(folder, plan["identity"], max(plan["shards"]))
    encoder = Encoder(spm_path, alpha, threads)
    target = target_vocabulary_path(spm_path)
    encoders = (encoder, encoder if target == spm_path else Encoder(target, alpha, threads))
    _tokenize_parts(corpora, folder, plan, encoders)
    tokenized = time.monotonic() - started
    manifest = {
        "format": FORMAT,
        "identity": plan["identity"],
        "dtype": plan["dtype"],
        "special_ids": plan.get("special_ids", {}),
        "corpora": _shuffle_shards(corpora, folder, plan),
        "seconds": {
            "tokenizing": round(tokenized, 1),
            "shuffling": round(time.monotonic() - started - tokenized, 1),
        },
    }
    write_json(os.path.join(folder, MANIFEST), manifest)
    shutil.rmtree(os.path.join(folder, "parts"), ignore_errors=True)
    return manifest


def _tokenize_parts(corpora, folder, plan, encoders):
    """Pass 1: every part not yet complete, tokenized into its bucket files."""
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
                    progress.update(sum(_read_done(part_folder)["records"]))
                    if not all(done[part:]):
                        collections.deque(part_lines, maxlen=0)
                    continue
                _write_part(part_lines, index, copy, part, plan, encoders, folder, progress)
        logger.info("%s", progress.line())


def _shuffle_shards(corpora, folder, plan):
    """Pass 2: every shard not yet complete written; the manifest's entry of each corpus."""
    entries = []
    for index, corpus in enumerate(corpora):
        logger.info("Shuffling %d shards of %s", plan["shards"][index], corpus.name)
        summaries = _part_summaries(folder, index, plan)
        shards = []
        for shard in range(plan["shards"][index]):
            path = os.path.join(folder, shard_name(index, shard))
            if not os.path.exists(path):  # a shard is renamed into place complete
                _write_shard(folder, index, shard, plan, summaries)
            records = sum(summary["records"][shard] for summary in summaries)
            shards.append({"file": shard_name(index, shard), "records": records,
                           "bytes": os.path.getsize(path)})  # fmt: skip
        entries.append(
            {
                "name": corpus.name,
                "share": plan["shares"][index],
                "lines": plan["lines"][index],
                "pairs": plan["pairs"][index],
                "examples": sum(s["records"] for s in shards),
                "source_tokens": sum(s["source_tokens"] for s in summaries),
                "target_tokens": sum(s["target_tokens"] for s in summaries),
                "shards": shards,
            }
        )
    return entries


def _begin(folder, identity, files):
    """Starts or resumes a preparation in `folder`, clearing what one of other data left.

    The manifest goes first (it is written anew at the end), so no reader
    trusts a folder being prepared; parts and shards of another identity (a
    vocabulary trained again since) go too. Open files are allowed for
    `files` bucket files at once.
    """
    os.makedirs(folder, exist_ok=True)
    if os.path.exists(os.path.join(folder, MANIFEST)):
        os.remove(os.path.join(folder, MANIFEST))
    path = os.path.join(folder, "identity.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            if json.load(handle) != identity:
                shutil.rmtree(os.path.join(folder, "parts"), ignore_errors=True)
                for name in os.listdir(folder):
                    if name.startswith("shard-"):
                        os.remove(os.path.join(folder, name))
    write_json(path, identity)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = files + 64  # and a margin for TensorFlow's own
    if soft < needed and (hard == resource.RLIM_INFINITY or hard >= needed):
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    elif soft < needed:
        raise DataError(
            f"shard_size: {files} shards need {needed} open files, over this system's limit "
            f"of {hard}: raise shard_size"
        )
