"""Parallel corpora: aligned text files, Multi30k, and TFDS translation datasets.

Every loader returns sentence pairs `(source, target)`; files are read and
checked in Python before anything reaches tf.data, so a bad corpus fails with a
message that names the file and line instead of an error from inside a graph.
"""

import gzip
import logging
import os

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


def read_lines(path):
    """Reads a UTF-8 text file (plain or `.gz`), one sentence a line.

    Args:
        path: str, the file.

    Returns:
        list of str, the lines without their line endings.

    Raises:
        DataError: the file is missing, is not gzip when named `.gz`, or has a
            line that is not valid UTF-8 (the message gives its number).
    """
    lines = []
    with _open_text(path) as handle:
        try:
            for number, raw in enumerate(handle, start=1):
                try:
                    lines.append(raw.decode("utf-8").rstrip("\r\n"))
                except UnicodeDecodeError as error:
                    raise DataError(
                        f"{path}, line {number}: not valid UTF-8 "
                        f"(byte {raw[error.start : error.start + 1]!r} at column {error.start + 1})"
                    ) from None
        except (OSError, EOFError) as error:
            raise DataError(f"{path}: cannot be read ({error})") from None
    return lines


def read_parallel_files(source_path, target_path):
    """Reads two aligned files into sentence pairs.

    Pairs where either side is empty or whitespace only are dropped; how many is
    logged, so nothing disappears silently.

    Args:
        source_path: str, source sentences, one a line (plain or `.gz`).
        target_path: str, the aligned target sentences.

    Returns:
        list of `(source, target)` str pairs, stripped.

    Raises:
        DataError: a file is missing or undecodable, the line counts differ, or
            no non-empty pair is left.
    """
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise DataError(
            "Parallel files are not aligned: "
            f"{source_path} has {len(sources)} lines, {target_path} has {len(targets)} lines"
        )
    pairs = [(s.strip(), t.strip()) for s, t in zip(sources, targets, strict=True)]
    kept = [(s, t) for s, t in pairs if s and t]
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


def load_tfds(name, split, data_dir=None, download=True):
    """Loads a TFDS translation dataset as a tf.data dataset of string pairs.

    Args:
        name: str, a TFDS name with its config, e.g. "wmt14_translate/de-en"
            or "ted_hrlr_translate/pt_to_en".
        split: str, a TFDS split such as "train" or "validation".
        data_dir: str or None, where TFDS keeps (or finds) prepared data.
        download: bool, whether TFDS may download and prepare the data.

    Returns:
        `tf.data.Dataset` of `(source, target)` scalar string tensors, in the
        dataset's supervised order.
    """
    import tensorflow_datasets as tfds

    builder_name = name.split("/")[0]
    if builder_name not in tfds.list_builders():
        raise DataError(f"Unknown TFDS dataset {name!r}: no builder named {builder_name!r}")
    try:
        return tfds.load(
            name, split=split, as_supervised=True, data_dir=data_dir, download=download
        )
    except (ValueError, KeyError, AssertionError) as error:
        raise DataError(f"Cannot load TFDS dataset {name!r} split {split!r}: {error}") from None
