"""Decoding controls in the graph: per-sentence settings, checked, and banned words tokenized.

The SavedModel's `controlled` signature takes one value of each control a
sentence (batch-major, so TF Serving's batcher can merge requests), with
neutral values for a control that is not wanted (`NEUTRAL`). Banned words
come as text: one string a sentence holding its words and phrases, one a
line ("" for none); each is tokenized alone in the graph with the target
vocabulary, and the searches ban its last piece where the translation ends
with the others (a word as it appears after a space, so also at the start of
a sentence).
"""

import tensorflow as tf

from keras_transformer.decoding.controls import DecodingControls
from pipelines.serving.rows import check_rows, refuse_rows

# Each control's input: dtype, and the value that turns it off; banned words,
# as text, stand for `DecodingControls`' banned_tokens.
CONTROLS = {
    **{
        name: (tf.as_dtype(dtype), neutral)
        for name, (dtype, neutral) in DecodingControls.SETTINGS.items()
    },
    "banned_words": (tf.string, ""),
}
NEUTRAL = {name: neutral for name, (_, neutral) in CONTROLS.items()}


def control_specs():
    """The `tf.TensorSpec`s `[None]` of the controls, in `CONTROLS` order."""
    return [tf.TensorSpec([None], dtype, name=name) for name, (dtype, _) in CONTROLS.items()]


def controls_on(tensors):
    """Whether any sentence has a decoding control on (a bool scalar).

    Args:
        tensors: dict of `(B,)` settings and `banned_tokens` `(B, N, L)`, as
            `control_tensors` returns them.

    Returns:
        bool scalar tensor.
    """
    on = [tf.reduce_any(tensors["banned_tokens"] >= 0)]  # -1 pads: no word banned
    for name, (_, neutral) in CONTROLS.items():
        if name != "banned_words":
            on.append(tf.reduce_any(tensors[name] != neutral))
    return tf.reduce_any(tf.stack(on))


def banned_word_ids(tokenizer, banned_words):
    """Each sentence's banned words as right-aligned piece ids, as the searches take them.

    Args:
        tokenizer: the tensorflow-text target tokenizer.
        banned_words: string `(B,)`, words and phrases one a line.

    Returns:
        int32 `(B, N, L)`: each phrase's pieces at the right end of its row,
        -1 (any token) on the left; rows of -1 where a sentence has fewer
        phrases.
    """
    banned_words = tf.strings.unicode_transcode(
        banned_words, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )
    phrases = tf.strings.split(banned_words, "\n")  # ragged (B, N)
    phrases = tf.ragged.boolean_mask(phrases, tf.strings.length(tf.strings.strip(phrases)) > 0)
    pieces = tf.cast(tokenizer.tokenize(phrases.values), tf.int32)  # ragged (P, L), every phrase
    dense = pieces.to_tensor(-1)  # (P, L), left-aligned
    width = tf.shape(dense)[1]
    shift = width - tf.cast(pieces.row_lengths(), tf.int32)  # (P,)
    origin = tf.range(width)[None] - shift[:, None]  # (P, L): the column each position reads
    aligned = tf.where(
        origin >= 0, tf.gather(dense, tf.maximum(origin, 0), batch_dims=1), -1
    )  # (P, L), right-aligned
    # One "any" column on the left keeps L >= 1 and changes no rule.
    aligned = tf.pad(aligned, [[0, 0], [1, 0]], constant_values=-1)
    per_sentence = tf.RaggedTensor.from_row_splits(aligned, phrases.row_splits)  # (B, None, L + 1)
    return per_sentence.to_tensor(-1)


def control_tensors(tokenizer, sentences, controls):
    """The controls of a request, checked row by row, as the searches take them.

    Args:
        tokenizer: the tensorflow-text target tokenizer.
        sentences: string `(B,)`.
        controls: dict of `CONTROLS`' names to `(B,)` values.

    Returns:
        dict: the five settings as `(B,)` tensors and `banned_tokens` int32
        `(B, N, L)` (see `banned_word_ids`).
    """
    tensors = {
        name: tf.convert_to_tensor(controls[name], dtype) for name, (dtype, _) in CONTROLS.items()
    }
    check_rows(sentences, **tensors)
    for valid, message, _ in DecodingControls.rules(tensors):
        refuse_rows(~valid, f"{message}; rows:")
    tensors["banned_tokens"] = banned_word_ids(tokenizer, tensors.pop("banned_words"))
    return tensors
