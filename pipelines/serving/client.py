"""Translating lines with an exported SavedModel from Python.

Needs only TensorFlow and tensorflow-text (for the SentencePiece ops the
SavedModel's graph holds); never imports Keras or `keras_transformer`.
"""

import json
import os

import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops the SavedModel uses

from pipelines.errors import ExportError
from pipelines.serving.versions import broken_version_message, resolve_version

# The sentences' input name in every signature.
SIGNATURE_INPUT = "inputs"
# Where an export records its search settings (beside TF Serving's warm-up file).
SETTINGS_FILE = os.path.join("assets.extra", "keras_transformer.json")
# What exports made before SETTINGS_FILE searched with.
EARLIER_SETTINGS = {
    "beam_size": 4,
    "alpha": 0.6,
    "nbest": 4,
    "extra_length": 50,
    "tree_constraint": False,
    "tree_words": False,
    "penalty_form": "gnmt",
    "max_output_length": 0,
    "end_at_limit": False,
    "batching": False,
}


def load_signature(path, name="translate"):
    """The signature `name` of the SavedModel at `path` (a version or model folder).

    Args:
        path: str, a version folder (`NAME/VERSION`) or a model folder (`NAME`), whose
            newest complete version is loaded.
        name: str, the signature: `translate`, `nbest`, `score`, `prefix`, `align`,
            `sample`, `controlled`, `controlled_search`, `controlled_sample` or
            `serving_default`.

    Returns:
        `(version_folder, signature)`.

    Raises:
        ExportError: naming the version folder that does not load and, when
            there is one, an older version that does.
    """
    version = resolve_version(path)
    try:
        signatures = tf.saved_model.load(version).signatures
    except (OSError, ValueError, KeyError, tf.errors.OpError) as error:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error)
        base, number = os.path.split(os.path.normpath(version))
        if number.isdigit():
            raise ExportError(broken_version_message(base, int(number), reason)) from None
        raise ExportError(f"the SavedModel {version} is broken: {reason}") from None
    if name not in signatures:
        raise ExportError(
            f"the SavedModel {version} has no {name} signature (it has {', '.join(signatures)}): "
            "an export made before it or without it (--signatures); export the model again"
        )
    return version, signatures[name]


def export_settings(version):
    """The search settings a SavedModel version was exported with.

    Args:
        version: str, a version folder (`saved_models/NAME/1`).

    Returns:
        dict: `beam_size`, `alpha`, `nbest`, `extra_length` (target pieces a
        sentence may produce beyond its source pieces, end of sentence
        included), `tree_constraint` (searches write only trees),
        `tree_words` (a parser writes each word before its tag),
        `penalty_form`, `max_output_length`, `end_at_limit` (see
        `Translator`'s `lengths`), `batching` (its warm-up suits TF
        Serving's `--enable_batching`: `kt export --batching`) and, for
        exports that record them, `max_source_length`, `quantize` (None,
        "int8" or "int8-weights") and `signatures` (the names it holds).
        Exports made before the settings file get the settings they used.

    Raises:
        ExportError: the file is there but not a JSON object.
    """
    path = os.path.join(version, SETTINGS_FILE)
    if not os.path.exists(path):
        return dict(EARLIER_SETTINGS)
    try:
        with open(path, encoding="utf-8") as handle:
            settings = json.load(handle)
    except (OSError, ValueError) as error:
        raise ExportError(f"{path}: not readable JSON ({error})") from None
    if not isinstance(settings, dict):
        raise ExportError(f"{path}: not a JSON object of settings")
    return {**EARLIER_SETTINGS, **settings}


def call_in_batches(signature, lines, batch_size=1024, rows=None, scalars=None):
    """Calls a signature on lines in batches of similar length; outputs come back in input order.

    Args:
        signature: a SavedModel signature whose `inputs` is string `[None]`.
        lines: list of bytes, one sentence each.
        batch_size: int, sentences per call; the SavedModel sorts a call's
            sentences by length and searches them in chunks.
        rows: dict of the signature's other batch-major inputs, name ->
            `(values, dtype)` with one value per line.
        scalars: dict of inputs shared by every call, name -> tensor.

    Returns:
        dict, output name -> list with one NumPy value (a row) per line.
    """
    rows, scalars = rows or {}, scalars or {}
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    results = {}
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        inputs = {
            name: tf.constant([values[i] for i in batch], dtype)
            for name, (values, dtype) in rows.items()
        }
        outputs = signature(
            **{SIGNATURE_INPUT: tf.constant([lines[i] for i in batch], tf.string)},
            **inputs,
            **scalars,
        )
        for name, values in outputs.items():
            column = results.setdefault(name, [None] * len(lines))
            for i, value in zip(batch, values.numpy(), strict=True):
                column[i] = value
    return results


def takes(signature, name):
    """Whether a loaded signature has the input `name` (exports made before it was added lack
    it: `translate`'s `penalty_form`); a plain callable standing in for one is taken to."""
    spec = getattr(signature, "structured_input_signature", None)
    return spec is None or name in spec[1]


def translate_lines(signature, lines, beam_size=4, alpha=0.6, batch_size=1024, penalty_form=""):
    """Translates byte strings in batches of similar length, returning them in order.

    Args:
        signature: the SavedModel's `translate` signature.
        lines: list of bytes, one sentence each.
        beam_size: int, 1 for greedy search.
        alpha: float, length penalty exponent.
        batch_size: int, sentences per call.
        penalty_form: str, the length penalty's form, "gnmt" or "power" ("":
            the export's; an export without the input searches with GNMT's).

    Returns:
        `(translations, scores)`: lists of str and float in input order.
    """
    scalars = {
        "beam_size": tf.constant(beam_size, tf.int32),
        "alpha": tf.constant(alpha, tf.float32),
    }
    if takes(signature, "penalty_form"):
        scalars["penalty_form"] = tf.constant(penalty_form)
    elif penalty_form not in ("", "gnmt"):
        raise ExportError(
            "this export's translate signature has no penalty_form (exported before it); "
            f"it searches with GNMT's penalty, not {penalty_form!r}: export the model again"
        )
    outputs = call_in_batches(signature, lines, batch_size, scalars=scalars)
    translations = [text.decode("utf-8") for text in outputs.get("translations", [])]
    return translations, [float(score) for score in outputs.get("scores", [])]


def word_alignments(source_pieces, target_pieces, positions):
    """Piece alignments of the `align` signature as word pairs `"i-j"`, fast_align's format.

    Words are the whitespace-separated words of the source sentence and of
    its translation: a SentencePiece piece starting with "\u2581" starts a
    word, and every other piece belongs to the word before it.

    Args:
        source_pieces: list of str, the source's pieces ("" past the end).
        target_pieces: list of str, the translation's pieces ("" past the end).
        positions: list of int, for each target piece the source piece it
            aligns to, -1 for none.

    Returns:
        str, pairs "source_word-target_word" sorted and without repeats,
        separated by spaces.
    """
    source_words, target_words = _word_indices(source_pieces), _word_indices(target_pieces)
    pairs = {
        (source_words[position], target_words[j])
        for j, position in enumerate(positions)
        if position >= 0 and j < len(target_words) and position < len(source_words)
    }
    return " ".join(f"{i}-{j}" for i, j in sorted(pairs))


def _word_indices(pieces):
    """The word index of each piece, up to the first empty one."""
    indices, word = [], -1
    for piece in pieces:
        if not piece:
            break
        if piece.startswith("\u2581") or word < 0:
            word += 1
        indices.append(word)
    return indices
