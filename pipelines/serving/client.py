"""Translating lines with an exported SavedModel from Python.

Needs only TensorFlow and tensorflow-text (for the SentencePiece ops the
SavedModel's graph holds); never imports Keras or `keras_transformer`.
"""

import os

import tensorflow as tf
import tensorflow_text  # noqa: F401  registers the SentencePiece ops the SavedModel uses

from pipelines.errors import ExportError
from pipelines.serving.versions import broken_version_message, resolve_version


def load_signature(path, name="translate"):
    """The signature `name` of the SavedModel at `path` (a version or model folder).

    Returns:
        `(version_folder, signature)`.

    Raises:
        ExportError: naming the version folder that does not load and, when
            there is one, an older version that does.
    """
    version = resolve_version(path)
    try:
        return version, tf.saved_model.load(version).signatures[name]
    except (OSError, ValueError, KeyError, tf.errors.OpError) as error:
        reason = str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error)
        base, number = os.path.split(os.path.normpath(version))
        if number.isdigit():
            raise ExportError(broken_version_message(base, int(number), reason)) from None
        raise ExportError(f"the SavedModel {version} is broken: {reason}") from None


def translate_lines(signature, lines, beam_size=4, alpha=0.6, batch_size=1024):
    """Translates byte strings in batches of similar length, returning them in order.

    Args:
        signature: the SavedModel's `translate` signature.
        lines: list of bytes, one sentence each.
        beam_size: int, 1 for greedy search.
        alpha: float, length penalty exponent.
        batch_size: int, sentences per call; the SavedModel sorts a call's
            sentences by length and searches them in chunks.

    Returns:
        `(translations, scores)`: lists of str and float in input order.
    """
    order = sorted(range(len(lines)), key=lambda i: len(lines[i]))
    translations, scores = [None] * len(lines), [None] * len(lines)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        outputs = signature(
            inputs=tf.constant([lines[i] for i in batch], tf.string),
            beam_size=tf.constant(beam_size, tf.int32),
            alpha=tf.constant(alpha, tf.float32),
        )
        for i, text, score in zip(
            batch, outputs["translations"].numpy(), outputs["scores"].numpy(), strict=True
        ):
            translations[i], scores[i] = text.decode("utf-8"), float(score)
    return translations, scores
