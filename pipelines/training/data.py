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
own share of the shards, and fails with the chief (`chief.py`). Nothing
holds the training corpus in memory: the validation and test sets, small,
are read whole.
"""

import dataclasses
import hashlib
import logging
import os
import shutil

from pipelines.data import (
    corpus,
    default_corpus,
    preparation,
    scan,
    shards,
    tokenizer,
    vocabulary_extension,
)
from pipelines.data.vocabularies import target_vocabulary_path
from pipelines.errors import DataError
from pipelines.files import atomic_output, atomic_text, read_json, write_json
from pipelines.parsing import trees
from pipelines.parsing.corpus import tags_path, target_tokens, treebank_pairs
from pipelines.training import chief
from pipelines.training.heldout import is_parser, tree_words
from pipelines.training.init_from import copy_vocabulary, find_source

logger = logging.getLogger(__name__)

# The most input streams a worker runs unless told (`default_input_streams`).
MAX_DEFAULT_STREAMS = 16


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
    batching, data, seed = config.batching, config.data, config.optimization.seed
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
        comparable = _as_recorded(plan["identity"], identity)
        differing = [k for k in identity if plan["identity"].get(k) != comparable[k]]
        if differing:
            data_dir = os.path.dirname(folder)
            raise DataError(
                f"{data_dir} holds data prepared from other data or settings "
                f"({', '.join(differing)}{_changed_files(plan['identity'], identity)}): "
                "train into a new output_dir"
            )
        return _replanned(plan, path, workers, config.batching.input_streams)
    found = scan.scan(corpora, batching.vocabulary_sample, seed)
    os.makedirs(folder, exist_ok=True)
    with atomic_text(os.path.join(folder, "sample.txt")) as handle:
        for source, target in found["sample"]:
            handle.write(f"{_one_line(source)}\n{_one_line(target)}\n")
    copies = identity["subword_copies"]
    streams = config.batching.input_streams or default_input_streams()
    pipelines = workers * streams
    plan = {
        "identity": identity,
        "lines": found["lines"],
        "pairs": found["pairs"],
        "shares": scan.mixing_shares(corpora, found["pairs"]),
        "shards": preparation.plan_shards(found["pairs"], copies, data.shard_size, pipelines),
        "seed": seed,
        "copies": copies,
        "workers": workers,
        "input_streams": streams,
    }
    write_json(path, plan)
    return plan


def _as_recorded(recorded, identity):
    """`identity` with each corpus file reduced to what the plan's `recorded` identity holds of it.

    A plan of an earlier version holds a file's path and size only, and still resumes.
    """
    corpora = []
    for index, entry in enumerate(identity["corpora"]):
        old = recorded.get("corpora") or []
        old_files = old[index].get("files", []) if index < len(old) else []
        files = entry.get("files")
        if files and len(old_files) == len(files):
            pairs = zip(old_files, files, strict=True)
            entry = {**entry, "files": [{name: f.get(name) for name in o} for o, f in pairs]}
        corpora.append(entry)
    return {**identity, "corpora": corpora}


def _changed_files(recorded, current):
    """`: PATH (what changed)` for each corpus file that differs from the plan's."""
    changes = []
    for old, new in zip(recorded.get("corpora", []), current["corpora"], strict=False):
        for f, g in zip(old.get("files", []), new.get("files", []), strict=False):
            names = [name for name in f if f.get(name) != g.get(name)]
            if names:
                changes.append(f"{g['path']}: {', '.join(names)} changed")
    return f"; {'; '.join(changes)}" if changes else ""


def default_input_streams():
    """One input stream per two cores this process may use (the rest feed the step), 1 to 16."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min((cores or 1) // 2, MAX_DEFAULT_STREAMS))


def _replanned(plan, path, workers, streams):
    """An existing plan for this run's workers and input streams, or a `DataError`.

    The workers must be those the shards were planned for: another number
    would share them unevenly or change the stream. Another number of
    streams (given; unset keeps the plan's) is taken where it shares every
    corpus's shards evenly, and recorded.
    """
    folder = os.path.dirname(path)
    planned = plan.get("workers")
    if planned is not None and planned != workers:
        raise DataError(
            f"{folder} was prepared for {planned} workers, and this run has {workers}: resume "
            f"it with {planned} (the workers of TF_CONFIG, or JAX processes), or train into a "
            "new output_dir with --init-from"
        )
    streams = streams or plan.get("input_streams", 1)
    pipelines = workers * streams
    if planned is None and min(plan["shards"]) < pipelines:  # a plan of an earlier version
        raise DataError(
            f"{folder} was prepared for {min(plan['shards'])} input pipelines, fewer than these "
            f"{workers} workers x {streams} input_streams: train into a new output_dir"
        )
    if planned is not None and any(count % pipelines for count in plan["shards"]):
        raise DataError(
            f"input_streams: {folder} holds {plan['shards']} shards a corpus, which {workers} "
            f"workers x {streams} input_streams cannot share evenly; choose input_streams "
            f"that divides them (it was {plan.get('input_streams', 1)}), or leave it unset"
        )
    if plan.get("input_streams", 1) != streams:
        plan = {**plan, "input_streams": streams}
        write_json(path, plan)
    return plan


def planned_streams(train_dir):
    """The input streams a worker reads, as the chief's plan in `train_dir` records them."""
    return read_json(os.path.join(train_dir, "plan.json")).get("input_streams", 1)


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
        character_coverage=batching.character_coverage,
        max_sentences=2 * batching.vocabulary_sample,
        seed=config.optimization.seed,
        whole_tokens=whole,
        options={"byte_fallback": True} if batching.byte_fallback else None,
    )


def extend_source_vocabulary(config, source, train_dir, spm_path):
    """Writes `spm_path`: the source's vocabulary and the pieces the run's data adds.

    The added pieces are those of an `extend_vocabulary`-piece BPE vocabulary
    trained on the run's sample (with the run's `train_vocabulary` settings)
    that the source's lacks (`vocabulary_extension.extended_model`); the
    source's normalisation and options stay (its `byte_fallback` too).

    Args:
        config: the run's `TrainConfig`.
        source: the `init_from` source (`init_from.Source`).
        train_dir: str, the folder of the run's `sample.txt`.
        spm_path: str, the `.model` file to write.
    """
    staging = os.path.join(train_dir, "new-data.model")
    grown = dataclasses.replace(
        config.batching, vocabulary_size=config.batching.extend_vocabulary, whole_source_words=0
    )
    try:
        train_vocabulary(
            dataclasses.replace(config, batching=grown), _sample_pairs(train_dir), staging
        )
    except DataError as error:
        raise DataError(f"extend_vocabulary={grown.vocabulary_size}: {error}") from None
    with open(staging, "rb") as handle:
        data, added = vocabulary_extension.extended_model(source.vocabulary, handle.read())
    with atomic_output(spm_path) as path, open(path, "wb") as handle:
        handle.write(data)
    os.remove(staging)
    old_size = tokenizer.vocabulary_size(spm_path) - len(added)
    sample = (sentence for pair in _sample_pairs(train_dir)() for sentence in pair)
    used = vocabulary_extension.pieces_used(data, sample, old_size)
    logger.info("extend_vocabulary: %d pieces added to %s's %d, %d of them in the new data's "
                "sample: %s", len(added), source.vocabulary, old_size, used,
                " ".join(added[:20]) + (" ..." if len(added) > 20 else ""))  # fmt: skip


def _file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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
    chief.clear_marks(out_dir)
    if workers == 1:
        return _prepare_data(config, out_dir, workers)
    with chief.failing_together(os.path.join(out_dir, "data")):
        return _prepare_data(config, out_dir, workers)


def _prepare_data(config, out_dir, workers):
    data_dir = os.path.join(out_dir, "data")
    corpora, validation_pairs, test_pairs = load_corpora(config)
    train_dir = os.path.join(data_dir, "train")
    spm_path = os.path.join(out_dir, "sentencepiece.model")
    plan = _plan(config, corpora, train_dir, workers, spm_path)
    if os.path.exists(spm_path):  # a resumed run keeps its vocabulary
        pass
    elif config.model.init_from and config.batching.extend_vocabulary:  # grown
        extend_source_vocabulary(config, find_source(config.model.init_from), train_dir, spm_path)
    elif config.model.init_from:  # the source model's, byte for byte
        copy_vocabulary(find_source(config.model.init_from), out_dir)
    else:
        train_vocabulary(config, _sample_pairs(train_dir), spm_path)
    if os.path.exists(os.path.join(train_dir, "sample.txt")):
        os.remove(os.path.join(train_dir, "sample.txt"))
    target = _checked_target_vocabulary(config, spm_path)
    identity = {**plan["identity"], "vocabulary": _file_sha256(spm_path)}
    if target != spm_path:  # one a side (an imported model's): the shards' targets differ
        identity["target_vocabulary"] = _file_sha256(target)
    sizes = [tokenizer.vocabulary_size(path) for path in (spm_path, target)]
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
    write_json(os.path.join(data_dir, chief.READY), {"validation": validation is not None})
    return train, validation, (validation_pairs, test_pairs)


def _checked_target_vocabulary(config, spm_path):
    """The targets' SentencePiece file, as the run's config says it has one (or not).

    Raises:
        DataError: the file beside `spm_path` says otherwise.
    """
    target = target_vocabulary_path(spm_path)
    if (target != spm_path) != config.batching.target_vocabulary:
        found = "holds" if target != spm_path else "lacks"
        raise DataError(
            f"{os.path.dirname(spm_path)} {found} sentencepiece.target.model, and the run's "
            f"target_vocabulary is {str(config.batching.target_vocabulary).lower()}: restore the "
            "run's vocabulary files, or train into a new output_dir"
        )
    return target


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
    ready = chief.wait_for_chief(data_dir)
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


def _complete(folder):
    manifest = shards.read_manifest(folder)
    if manifest is None:
        raise DataError(f"{folder}: the chief marked it ready, but it is not complete")
    return manifest
