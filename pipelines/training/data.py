"""A run's data: its corpora, vocabulary and prepared shards, made by the chief, read by all.

The chief (worker or process 0) prepares under `OUTPUT_DIR/data/`, in steps
that a rerun skips when complete:
  1. `plan.json`: one streaming pass over the corpora (`scan.scan`) checks
     and counts them and draws the vocabulary's sample (`sample.txt`);
  2. `sentencepiece.model`: trained on that sample, beside the run's other
     outputs (or copied from the `init_from` model); the sample is then removed;
  3. `train/` and `validation/`: tokenized shards and their manifest
     (`preparation.prepare_shards`).
Every other worker waits for the chief's complete manifests and reads its
own share of the shards. The workers fail with the chief: it writes
`failed.json` on any exception, and beats (`chief.json`) while it prepares, so
a worker whose chief was killed stops within `SILENT_SECONDS` instead of
waiting forever. Nothing holds the training corpus in memory: the validation
and test sets, small, are read whole.
"""

import contextlib
import hashlib
import logging
import os
import shutil
import socket
import threading
import time

from pipelines.data import corpus, default_corpus, preparation, scan, shards, tokenizer
from pipelines.data.progress import PROGRESS_SECONDS
from pipelines.data.vocabularies import target_vocabulary_path
from pipelines.errors import DataError, UsageError
from pipelines.files import atomic_text, read_json, write_json
from pipelines.parsing import trees
from pipelines.parsing.corpus import tags_path, target_tokens, treebank_pairs
from pipelines.training.heldout import is_parser, tree_words
from pipelines.training.init_from import copy_vocabulary, find_source

logger = logging.getLogger(__name__)

# Written by the chief once the training and validation data are complete, or once it failed.
READY, FAILED = "ready.json", "failed.json"
# Rewritten by the chief every `BEAT_SECONDS` while it prepares.
ALIVE, BEAT_SECONDS = "chief.json", 5.0
# A waiting worker gives up on a chief whose beat has not changed this long (by the
# worker's own clock: the machines' clocks may differ), or that has not begun to beat.
SILENT_SECONDS, FIRST_BEAT_SECONDS = 40.0, 120.0
# Seconds between two looks of a waiting worker.
POLL_SECONDS = 5.0


def load_corpora(config):
    """The training corpora and the held-out sets of the configured data.

    Returns:
        `(corpora, validation, test)`: a list of `corpus.Corpus`, and lists of
        `(source, target)` str pairs or None (no such split).
    """
    data = config.data
    if data.corpus == "default":
        splits = default_corpus.default_corpus(
            data.default_corpus_sizes, data.target_locale, config.optimization.seed
        )
        train = [corpus.pairs_corpus("the default corpus", splits["train"])]
        return train, splits["validation"], splits["test"]
    if data.corpus == "multi30k":

        def load(split):
            return corpus.load_multi30k(
                data.multi30k_dir, split, data.source_language, data.target_language
            )

        train = [corpus.pairs_corpus(f"Multi30k {data.multi30k_dir}", load("train"))]
        return train, load("validation"), load("test")
    if data.corpus == "ptb":

        def load(split):
            return treebank_pairs(
                data.treebank_dir, split, data.treebank_pos_tags, data.treebank_words
            )[0]

        pairs = load("train")
        if not pairs:
            raise DataError(
                f"treebank_dir {data.treebank_dir}: no wsj_NNNN.mrg files of the "
                "train split (wsj_0001-0141)"
            )
        train = [corpus.pairs_corpus(f"treebank {data.treebank_dir}", pairs)]
        # Test files are often kept aside.
        return train, load("dev") or None, load("test") or None
    if data.corpus == "files":
        files, weights = data.train_files, data.train_weights or [None] * len(data.train_files)
        train = [
            corpus.files_corpus(files[2 * i], files[2 * i + 1], weights[i])
            for i in range(len(files) // 2)
        ]
        validation = data.validation_files
        return train, corpus.read_parallel_files(*validation) if validation else None, None

    def tfds(split):
        return corpus.tfds_corpus(
            data.tfds_name, split, data.tfds_data_dir, data.tfds_source_language
        )

    validation = tfds(data.tfds_validation_split)
    return [tfds(data.tfds_train_split)], list(corpus.nonempty(validation.lines())), None


def _plan(config, corpora, folder, workers, spm_path):
    """The scan's counts and the shard plan, from `plan.json` or a new scan (writing the sample).

    Raises:
        DataError: `folder` holds a plan of other corpora or data settings.
    """
    path = os.path.join(folder, "plan.json")
    batching, seed = config.batching, config.optimization.seed
    identity = {
        "corpora": [c.identity for c in corpora],
        "weights": [c.weight for c in corpora],
        "seed": seed,
        "vocabulary_sample": batching.vocabulary_sample,
        "shard_size": config.data.shard_size,
        "subword_sampling": batching.subword_sampling,
        "subword_copies": batching.subword_copies if batching.subword_sampling else 1,
    }
    sample = os.path.join(folder, "sample.txt")
    if os.path.exists(path) and not (os.path.exists(spm_path) or os.path.exists(sample)):
        os.remove(path)  # the vocabulary was removed after its sample: sample again
    if os.path.exists(path):
        plan = read_json(path)
        if plan["identity"] != identity:
            differing = [k for k in identity if plan["identity"].get(k) != identity[k]]
            data_dir = os.path.dirname(folder)
            raise DataError(
                f"{data_dir} holds data prepared from other data or settings "
                f"({', '.join(differing)}): train into a new output_dir"
            )
        return plan
    found = scan.scan(corpora, batching.vocabulary_sample, seed)
    os.makedirs(folder, exist_ok=True)
    with atomic_text(os.path.join(folder, "sample.txt")) as handle:
        for source, target in found["sample"]:
            handle.write(f"{_one_line(source)}\n{_one_line(target)}\n")
    copies = identity["subword_copies"]
    plan = {
        "identity": identity,
        "lines": found["lines"],
        "pairs": found["pairs"],
        "shares": scan.mixing_shares(corpora, found["pairs"]),
        "shards": preparation.plan_shards(found["pairs"], copies, config.data.shard_size, workers),
        "seed": seed,
        "copies": copies,
    }
    write_json(path, plan)
    return plan


def _one_line(text):
    return " ".join(text.splitlines())


def _sample_pairs(folder):
    """A function returning a fresh iterator over the sample's pairs, read from `sample.txt`."""

    def pairs():
        with open(os.path.join(folder, "sample.txt"), encoding="utf-8") as handle:
            lines = (line.rstrip("\n") for line in handle)
            yield from zip(lines, lines, strict=False)  # two lines a pair

    return pairs


def train_vocabulary(config, sample, spm_path):
    """Trains the run's SentencePiece vocabulary on `sample` pairs, writing `spm_path`.

    It keeps whole each distinct target token (`whole_target_tokens`) and the
    `whole_source_words` most frequent source words, both as the sample has
    them. A parser's vocabulary that keeps source words whole lists its tags
    beside it (`tags_path`), written first: the vocabulary's file marks the
    step done for a resumed run.

    Args:
        config: the run's `TrainConfig`.
        sample: callable returning a fresh iterator over `(source, target)`
            str pairs (the whole sample is never held in memory).
        spm_path: str, the `.model` file to write.

    Raises:
        DataError: the tokens kept whole would fill the vocabulary.
    """
    batching = config.batching
    tokens = []
    if batching.whole_target_tokens or (batching.whole_source_words and is_parser(config)):
        tokens = target_tokens(sample(), tree_words(config))
    if batching.whole_target_tokens and len(tokens) >= batching.vocabulary_size // 2:
        raise DataError(
            f"whole_target_tokens: the targets have {len(tokens)} distinct tokens, too many for "
            f"vocabulary_size {batching.vocabulary_size} (at most half of it); "
            "it is meant for closed target vocabularies such as linearised trees"
        )
    words = tokenizer.frequent_words((s for s, _ in sample()), batching.whole_source_words)
    whole = sorted(set(tokens if batching.whole_target_tokens else []).union(words))
    if len(whole) > batching.vocabulary_size * 3 // 4:
        raise DataError(
            f"whole_source_words: {len(whole)} tokens kept whole, too many for vocabulary_size "
            f"{batching.vocabulary_size} (at most three quarters of it, so that other words "
            f"still have pieces). Received: whole_source_words={batching.whole_source_words}"
        )
    listed = tags_path(spm_path)
    if words and is_parser(config):  # the tags are told apart from the source words kept whole
        with atomic_text(listed) as handle:
            handle.writelines(f"{tag}\n" for tag in sorted(trees.word_tags(tokens)))
    elif os.path.exists(listed):  # left by an earlier attempt with other settings
        os.remove(listed)
    logger.info("Training a %d-piece SentencePiece vocabulary", batching.vocabulary_size)
    tokenizer.train_sentencepiece(
        (sentence for pair in sample() for sentence in pair),
        spm_path,
        batching.vocabulary_size,
        max_sentences=2 * batching.vocabulary_sample,
        seed=config.optimization.seed,
        whole_tokens=whole,
    )


def _file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def clear_marks(chief_dir):
    """Removes an earlier attempt's ready and failed marks: the chief's first step.

    Called before the workers meet (the strategy or distribution starts),
    so none of them can take an earlier attempt's mark for this one's.
    """
    for name in (READY, FAILED, ALIVE):
        path = os.path.join(chief_dir, "data", name)
        if os.path.exists(path):
            os.remove(path)


def prepare_data(config, out_dir, workers=1):
    """The chief's preparation: plan, vocabulary, training and validation shards.

    With other workers, the chief beats in `data/chief.json` while it
    prepares, and any exception (a bad line, a refused setting, a full disk,
    an interruption) is also written to `data/failed.json`, so they stop with
    it instead of waiting (`wait_for_chief`).

    Args:
        config: the run's `TrainConfig`.
        out_dir: str, the run's folder.
        workers: int, input pipelines that will read the shards (each needs
            one of every corpus).

    Returns:
        `(train, validation, test)`: the training manifest (`shards.read_manifest`),
        the validation manifest or None, and the held-out pair lists
        `(validation_pairs, test_pairs)` as `load_corpora` gives them.
    """
    clear_marks(out_dir)
    if workers == 1:
        return _prepare_data(config, out_dir, workers)
    data_dir = os.path.join(out_dir, "data")
    with _beating(data_dir):
        try:
            return _prepare_data(config, out_dir, workers)
        except BaseException as error:
            with contextlib.suppress(OSError):  # a full disk: the workers see the beat stop
                write_json(os.path.join(data_dir, FAILED), {"error": _described(error)})
            raise


def _described(error):
    if isinstance(error, UsageError):
        return str(error)
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


@contextlib.contextmanager
def _beating(data_dir):
    """Rewrites `data_dir/chief.json` (a count, this host and process) every `BEAT_SECONDS`."""
    os.makedirs(data_dir, exist_ok=True)
    stop = threading.Event()
    path = os.path.join(data_dir, ALIVE)
    me = {"host": socket.gethostname(), "pid": os.getpid()}

    def write(count):
        with contextlib.suppress(OSError):
            write_json(path, {**me, "beat": count})

    def beat():
        count = 1
        while not stop.wait(BEAT_SECONDS):
            write(count)
            count += 1

    write(0)  # beating before the work begins
    thread = threading.Thread(target=beat, name="chief-beat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _prepare_data(config, out_dir, workers):
    data_dir = os.path.join(out_dir, "data")
    corpora, validation_pairs, test_pairs = load_corpora(config)
    train_dir = os.path.join(data_dir, "train")
    spm_path = os.path.join(out_dir, "sentencepiece.model")
    plan = _plan(config, corpora, train_dir, workers, spm_path)
    if min(plan["shards"]) < workers:
        raise DataError(
            f"{train_dir} was prepared for {min(plan['shards'])} workers, fewer than these "
            f"{workers}: train into a new output_dir"
        )
    if os.path.exists(spm_path):  # a resumed run keeps its vocabulary
        pass
    elif config.model.init_from:  # the source model's, byte for byte
        copy_vocabulary(find_source(config.model.init_from), out_dir)
    else:
        train_vocabulary(config, _sample_pairs(train_dir), spm_path)
    if os.path.exists(os.path.join(train_dir, "sample.txt")):
        os.remove(os.path.join(train_dir, "sample.txt"))
    identity = {**plan["identity"], "vocabulary": _file_sha256(spm_path)}
    sizes = [
        tokenizer.vocabulary_size(path) for path in (spm_path, target_vocabulary_path(spm_path))
    ]
    dtype = shards.record_dtype(max(sizes))
    ids = tokenizer.special_ids(spm_path)  # the examples' start, end and padding ids
    plan = {**plan, "identity": identity, "dtype": dtype, "special_ids": ids}
    train = preparation.prepare_shards(
        corpora, train_dir, spm_path, plan, config.batching.subword_sampling
    )
    _log_manifest(train_dir, train)
    validation = None
    if validation_pairs:
        validation = _prepare_heldout(validation_pairs, os.path.join(data_dir, "validation"), plan)
    # What the other workers wait for: both manifests are complete.
    write_json(os.path.join(data_dir, READY), {"validation": validation is not None})
    return train, validation, (validation_pairs, test_pairs)


def _prepare_heldout(pairs, folder, plan):
    """The validation pairs in one shard, deterministic segmentation."""
    identity = {"vocabulary": plan["identity"]["vocabulary"], "pairs": corpus.pairs_sha256(pairs)}
    heldout = {
        "identity": identity,
        "lines": [len(pairs)],
        "pairs": [len(pairs)],
        "shares": [1.0],
        "shards": [1],
        "seed": plan["seed"],
        "copies": 1,
        "dtype": plan["dtype"],
        "special_ids": plan["special_ids"],
    }
    spm = os.path.join(os.path.dirname(os.path.dirname(folder)), "sentencepiece.model")
    return preparation.prepare_shards(
        [corpus.pairs_corpus("validation", pairs)], folder, spm, heldout
    )


def _log_manifest(folder, manifest):
    for entry in manifest["corpora"]:
        logger.info(
            "%s: %s examples in %d shards (%s share of the stream) in %s",
            entry["name"],
            f"{entry['examples']:,}",
            len(entry["shards"]),
            f"{entry['share']:.3f}",
            folder,
        )


def wait_for_data(chief_dir, out_dir):
    """A worker's side of `prepare_data`: the chief's complete data, and its vocabulary copied.

    Returns:
        As `prepare_data`; the held-out pairs are None (only the chief
        evaluates).
    """
    data_dir = os.path.join(chief_dir, "data")
    ready = wait_for_chief(data_dir)
    train = _complete(os.path.join(data_dir, "train"))
    validation = None
    if read_json(ready)["validation"]:
        validation = _complete(os.path.join(data_dir, "validation"))
    os.makedirs(out_dir, exist_ok=True)
    names = ("sentencepiece.model", "sentencepiece.target.model", tags_path("sentencepiece.model"))
    for name in names:
        if os.path.exists(os.path.join(chief_dir, name)):
            shutil.copyfile(os.path.join(chief_dir, name), os.path.join(out_dir, name))
    return train, validation, (None, None)


def wait_for_chief(data_dir, clock=time.monotonic, sleep=time.sleep):
    """Waits for the chief's ready mark in `data_dir`, its failed one, or its silence.

    Returns:
        str, the ready mark's path.

    Raises:
        DataError: with the chief's error, where its preparation failed; or
            where its beat (`chief.json`) stopped for `SILENT_SECONDS`, or
            never began in `FIRST_BEAT_SECONDS` (the chief was killed, or
            its machine lost).
    """
    started = last = changed = clock()
    beat = None
    while not os.path.exists(os.path.join(data_dir, READY)):
        if os.path.exists(os.path.join(data_dir, FAILED)):
            error = read_json(os.path.join(data_dir, FAILED))["error"]
            raise DataError(f"the chief's data preparation failed: {error}")
        now = _read_beat(data_dir)
        if now != beat:
            beat, changed = now, clock()
        elif beat is None and clock() - changed >= FIRST_BEAT_SECONDS:
            raise DataError(
                f"the chief has not begun preparing the data in {data_dir} in "
                f"{clock() - started:.0f} s (no {ALIVE}): it is not running; restart every worker"
            )
        elif beat is not None and clock() - changed >= SILENT_SECONDS:
            raise DataError(
                f"the chief stopped preparing the data in {data_dir}: its {ALIVE} "
                f"(host {beat.get('host')}, process {beat.get('pid')}) has not changed in "
                f"{clock() - changed:.0f} s; it was killed or lost its machine. "
                "Restart every worker"
            )
        if clock() - last >= PROGRESS_SECONDS:
            last = clock()
            logger.info("Waiting for the chief's data in %s (%.0f s)", data_dir, last - started)
        sleep(POLL_SECONDS)
    return os.path.join(data_dir, READY)


def _read_beat(data_dir):
    try:
        return read_json(os.path.join(data_dir, ALIVE))
    except (OSError, ValueError):  # not there yet, or removed by a restarting chief
        return None


def _complete(folder):
    manifest = shards.read_manifest(folder)
    if manifest is None:
        raise DataError(f"{folder}: the chief marked it ready, but it is not complete")
    return manifest
