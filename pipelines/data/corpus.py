"""Parallel corpora: aligned text files, Multi30k, and TFDS translation datasets.

Files are read as streams and checked in Python before anything reaches
tf.data, so a bad corpus fails with a message that names the file and line
instead of an error from inside a graph, and a corpus of any size costs the
memory of one line. A training corpus is a `Corpus`: a stream of line pairs
with a mixing weight (`files_corpus`, `pairs_corpus`, `tfds_corpus`); small
sets (validation, test) are read whole into lists of pairs.
"""

import dataclasses
import gzip
import hashlib
import itertools
import logging
import os
import typing

from pipelines.errors import DataError

logger = logging.getLogger(__name__)

MULTI30K_SPLITS = {"train": "train", "validation": "val", "test": "test_2016_flickr"}


def _open_text(path):
    if not os.path.exists(path):
        raise DataError(f"File not found: {path}")
    if os.path.isdir(path):
        raise DataError(f"Expected a file, found a directory: {path}")
    opener = gzip.open if path.endswith(".gz") else open
    return opener(path, "rb")


def iter_lines(path):
    """Streams a UTF-8 text file (plain or `.gz`), one sentence a line.

    Nothing is kept: lines are decoded and checked as they are read, so a file
    of any size costs the memory of one line.

    Args:
        path: str, the file.

    Yields:
        str, each line without its line ending.

    Raises:
        DataError: the file is missing, is not gzip when named `.gz`, or has a
            line that is not valid UTF-8 (the message gives its number).
    """
    with _open_text(path) as handle:
        try:
            for number, raw in enumerate(handle, start=1):
                try:
                    yield raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as error:
                    raise DataError(
                        f"{path}, line {number}: not valid UTF-8 "
                        f"(byte {raw[error.start : error.start + 1]!r} at column {error.start + 1})"
                    ) from None
        except (OSError, EOFError) as error:
            raise DataError(f"{path}: cannot be read ({error})") from None


def read_lines(path):
    """Reads a whole UTF-8 text file (plain or `.gz`): `list(iter_lines(path))`.

    For small files (validation and test sets, a file to translate); a
    training corpus is streamed with `iter_lines` or `iter_parallel_lines`.

    Args:
        path: str, a UTF-8 text file; a name ending in `.gz` is read through gzip.

    Returns:
        list of str, the lines without their line endings.
    """
    return list(iter_lines(path))


def iter_parallel_lines(source_path, target_path):
    """Streams two aligned files as stripped line pairs, empty ones included.

    Every line of the files gives one pair, so the pairs' positions are line
    numbers; `nonempty` drops the pairs with an empty side. Memory does not
    grow with the files.

    Args:
        source_path: str, source sentences, one a line (plain or `.gz`).
        target_path: str, the aligned target sentences.

    Yields:
        `(source, target)` str pairs, stripped of surrounding whitespace.

    Raises:
        DataError: a file is missing or undecodable, or the line counts differ
            (found at the end of the shorter file; both counts are named).
    """
    sources, targets = iter_lines(source_path), iter_lines(target_path)
    count = 0
    for source, target in itertools.zip_longest(sources, targets):
        if source is None or target is None:  # one file ended: count the other's remaining lines
            source_lines = count + (source is not None) + sum(1 for _ in sources)
            target_lines = count + (target is not None) + sum(1 for _ in targets)
            raise DataError(
                "Parallel files are not aligned: "
                f"{source_path} has {source_lines} lines, {target_path} has {target_lines} lines"
            )
        count += 1
        yield source.strip(), target.strip()


def nonempty(pairs):
    """The pairs of `pairs` whose two sides are both non-empty."""
    return ((source, target) for source, target in pairs if source and target)


# Longer lines are left out of training: their pieces could overflow the uint16 length of a
# prepared record (`pipelines.data.shards`), and no `max_length` a model trains with comes near
# (SentencePiece's pieces hold up to 16 characters).
MAX_CHARACTERS = 2**15 - 1
# A training file's sampled digest reads this many blocks of this size (4 MiB).
SAMPLED_BLOCKS, SAMPLED_BLOCK_BYTES = 64, 1 << 16


def trainable(pairs):
    """The pairs that training reads: both sides non-empty, neither over `MAX_CHARACTERS`."""
    return (
        (source, target)
        for source, target in nonempty(pairs)
        if len(source) <= MAX_CHARACTERS and len(target) <= MAX_CHARACTERS
    )


def read_parallel_files(source_path, target_path):
    """Reads two small aligned files into sentence pairs.

    Pairs where either side is empty or whitespace only are dropped; how many is
    logged, so nothing disappears silently. For validation and test sets: a
    training corpus is streamed (`iter_parallel_lines`, `pipelines.data.shards`).

    Args:
        source_path: str, source sentences, one a line (plain or `.gz`).
        target_path: str, the aligned target sentences.

    Returns:
        list of `(source, target)` str pairs, stripped.

    Raises:
        DataError: a file is missing or undecodable, the line counts differ, or
            no non-empty pair is left.
    """
    pairs = list(iter_parallel_lines(source_path, target_path))
    kept = list(nonempty(pairs))
    if len(kept) < len(pairs):
        logger.warning(
            "Dropped %d of %d pairs with an empty side from %s / %s",
            len(pairs) - len(kept),
            len(pairs),
            source_path,
            target_path,
        )
    if not kept:
        raise DataError(f"No sentence pairs in {source_path} / {target_path}: the corpus is empty")
    return kept


def load_multi30k(folder, split, source_language="en", target_language="de"):
    """Reads one split of Multi30k task 1 from its official file layout.

    Args:
        folder: str, a folder with `train.{lang}.gz`, `val.{lang}.gz` and
            `test_2016_flickr.{lang}.gz` (plain files without `.gz` also work).
        split: "train", "validation" or "test".
        source_language: str, e.g. "en".
        target_language: str, e.g. "de" or "fr".

    Returns:
        list of `(source, target)` str pairs.
    """
    if split not in MULTI30K_SPLITS:
        raise DataError(
            f"Unknown Multi30k split {split!r}; expected one of {list(MULTI30K_SPLITS)}"
        )
    if not os.path.isdir(folder):
        raise DataError(f"Multi30k folder not found: {folder}")

    def path(language):
        stem = os.path.join(folder, f"{MULTI30K_SPLITS[split]}.{language}")
        return stem + ".gz" if os.path.exists(stem + ".gz") else stem

    return read_parallel_files(path(source_language), path(target_language))


def load_tfds(name, split, data_dir=None, download=True, source_language=None):
    """Loads a TFDS translation dataset as a tf.data dataset of string pairs.

    Args:
        name: str, a TFDS name with its config, e.g. "wmt14_translate/de-en"
            or "ted_hrlr_translate/pt_to_en".
        split: str, a TFDS split such as "train" or "validation".
        data_dir: str or None, where TFDS keeps (or finds) prepared data.
        download: bool, whether TFDS may download and prepare the data.
        source_language: str or None, the feature (language) used as the
            source, the other one being the target: "en" for English ->
            German from "wmt14_translate/de-en", whose supervised order is
            German -> English. None: the supervised order.

    Returns:
        `tf.data.Dataset` of `(source, target)` scalar string tensors.
    """
    import tensorflow_datasets as tfds

    builder_name = name.split("/")[0]
    if builder_name not in tfds.list_builders():
        raise DataError(f"Unknown TFDS dataset {name!r}: no builder named {builder_name!r}")
    try:
        dataset = tfds.load(
            name,
            split=split,
            as_supervised=source_language is None,
            data_dir=data_dir,
            download=download,
        )
    except (ValueError, KeyError, AssertionError) as error:
        raise DataError(f"Cannot load TFDS dataset {name!r} split {split!r}: {error}") from None
    if source_language is None:
        return dataset
    languages = sorted(dataset.element_spec)
    if len(languages) != 2 or source_language not in languages:
        raise DataError(
            f"tfds_source_language: {name!r} has the features {languages}, "
            f"not {source_language!r} and one other language"
        )
    (target_language,) = set(languages) - {source_language}
    return dataset.map(lambda features: (features[source_language], features[target_language]))


def _tfds_lines(dataset):
    for source, target in dataset.as_numpy_iterator():
        yield source.decode("utf-8").strip(), target.decode("utf-8").strip()


@dataclasses.dataclass
class Corpus:
    """One training corpus, streamed: its pairs, its mixing weight, and what identifies it.

    Attributes:
        name: str, how logs and messages name it (its files, say).
        lines: callable returning a fresh iterator over every line pair,
            stripped, empty sides included, so that positions are line
            numbers (`iter_parallel_lines`).
        weight: float or None, its share of the training stream against the
            other corpora's weights; None: in proportion to its size.
        identity: dict, what a rerun compares to know it is the same corpus
            (files' paths, sizes, modification times and sampled digests; a
            digest of pairs in memory).
    """

    name: str
    lines: typing.Callable[[], typing.Iterator[tuple[str, str]]]
    weight: float | None = None
    identity: dict = dataclasses.field(default_factory=dict)


def _file_identity(path):
    """A file's path, size, modification time and sampled digest (`sampled_sha256`)."""
    _open_text(path).close()  # the errors of a missing file or a folder, before any work
    status = os.stat(path)
    return {
        "path": os.path.abspath(path),
        "bytes": status.st_size,
        "modified_ns": status.st_mtime_ns,
        "sampled_sha256": sampled_sha256(path),
    }


def sampled_sha256(path, blocks=SAMPLED_BLOCKS, block_bytes=SAMPLED_BLOCK_BYTES):
    """A digest of `blocks` blocks spread evenly over a file (all of a small one).

    Reading a few MiB rather than the whole corpus (gigabytes at WMT's size)
    keeps a rerun's check in milliseconds; with the size and the modification
    time it tells an edited file from the one the shards were made from.
    """
    digest = hashlib.sha256()
    size = os.path.getsize(path)
    with open(path, "rb") as handle:
        if size <= blocks * block_bytes:
            digest.update(handle.read())
            return digest.hexdigest()
        for index in range(blocks):
            handle.seek(index * (size - block_bytes) // (blocks - 1))
            digest.update(handle.read(block_bytes))
    return digest.hexdigest()


def files_corpus(source_path, target_path, weight=None):
    """A `Corpus` of two aligned text files (plain or `.gz`), read as streams."""
    return Corpus(
        name=f"{source_path} / {target_path}",
        lines=lambda: iter_parallel_lines(source_path, target_path),
        weight=weight,
        identity={"files": [_file_identity(source_path), _file_identity(target_path)]},
    )


def pairs_corpus(name, pairs, weight=None):
    """A `Corpus` of pairs already in memory (the embedded, Multi30k and treebank corpora)."""
    identity = {"sha256": pairs_sha256(pairs)}
    return Corpus(name=name, lines=lambda: iter(pairs), weight=weight, identity=identity)


def pairs_sha256(pairs):
    """A digest of `(source, target)` str pairs: equal for the same pairs in the same order."""
    digest = hashlib.sha256()
    for source, target in pairs:
        digest.update(f"{source}\t{target}\n".encode())
    return digest.hexdigest()


def tfds_corpus(name, split, data_dir=None, source_language=None):
    """A `Corpus` of a TFDS translation dataset's split (see `load_tfds`)."""
    dataset = load_tfds(name, split, data_dir, source_language=source_language)
    return Corpus(
        name=f"{name}[{split}]",
        lines=lambda: _tfds_lines(dataset),
        identity={"tfds": name, "split": split, "source_language": source_language},
    )
