"""The SavedModel's signatures beyond the export's plain search: prefixes, alignments, sampling,
decoding controls, and the two that combine them with any search a request asks for.

`pipelines.serving.saved_model`'s docstring lists every signature's inputs
and outputs; `Translator` builds them with the functions here.
"""

import tensorflow as tf

from keras_transformer.decoding.steps import PENALTY_FORMS
from pipelines.data.tokenizer import sides
from pipelines.serving.client import SIGNATURE_INPUT
from pipelines.serving.controls import CONTROLS, control_specs, control_tensors
from pipelines.serving.rows import check_rows
from pipelines.serving.sampling import sample_strings

# Every signature an export can hold, in the order `Translator.signatures` lists them.
SIGNATURES = (
    "serving_default", "nbest", "translate", "score", "prefix", "align", "sample",
    "controlled", "controlled_search", "controlled_sample",
)  # fmt: skip


def chosen_signatures(names):
    """`names` checked against `SIGNATURES` and put in their order; None is every signature.

    Args:
        names: iterable of str, or None.

    Returns:
        tuple of str.

    Raises:
        ValueError: an unknown name, or none at all.
    """
    if names is None:
        return SIGNATURES
    names = set(names)
    unknown = sorted(names - set(SIGNATURES))
    if unknown or not names:
        raise ValueError(
            f"signatures must be some of {', '.join(SIGNATURES)}. "
            f"Received: {', '.join(unknown) or 'none'}"
        )
    return tuple(name for name in SIGNATURES if name in names)


def form_offset(form, default):
    """A request's length penalty form (string scalar, "" for `default`) as its float32 offset
    (`PENALTY_FORMS`)."""
    matches = tf.equal(tf.where(tf.equal(form, ""), default, form), list(PENALTY_FORMS))
    tf.debugging.assert_equal(
        tf.reduce_any(matches), True,
        message=f'penalty_form must be one of {sorted(PENALTY_FORMS)} or ""',
    )  # fmt: skip
    offsets = tf.constant(list(PENALTY_FORMS.values()), tf.float32)
    return tf.gather(offsets, tf.argmax(tf.cast(matches, tf.int32)))


def guided_signatures(translate, model, tokenizer, beam_size, alpha, limits):
    """The `prefix`, `align`, `sample` and `controlled` signatures (see `saved_model`).

    Args:
        translate: callable `(sentences, beam_size, alpha, num_hypotheses,
            **options) -> translate_strings(...)` over the export's model.
        model, tokenizer: the export's model and tensorflow-text tokenizer.
        beam_size, alpha: the export's search settings.
        limits: `(max_source_length, chunk_size, extra_length)`, as
            `Translator` takes them.

    Returns:
        four `tf.function`s with input signatures.
    """
    sentences_spec = tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)
    prefixes_spec = tf.TensorSpec([None], tf.string, name="prefixes")

    @tf.function(input_signature=[sentences_spec, prefixes_spec])
    def prefix(inputs, prefixes):
        check_rows(inputs, prefixes=prefixes)
        texts, scores = translate(inputs, beam_size, alpha, 1, prefixes=prefixes)
        return {"translations": texts[:, 0], "scores": scores[:, 0]}

    @tf.function(input_signature=[sentences_spec, prefixes_spec])
    def align(inputs, prefixes):
        check_rows(inputs, prefixes=prefixes)
        texts, scores, aligned = translate(
            inputs, beam_size, alpha, 1, prefixes=prefixes, return_alignments=True
        )
        return {
            "translations": texts[:, 0],
            "scores": scores[:, 0],
            "alignments": aligned["alignments"][:, 0],
            "target_pieces": aligned["target_pieces"][:, 0],
            "source_pieces": aligned["source_pieces"],
        }

    @tf.function(
        input_signature=[
            sentences_spec,
            tf.TensorSpec([None], tf.float32, name="temperature"),
            tf.TensorSpec([None], tf.int32, name="top_k"),
            tf.TensorSpec([None], tf.float32, name="top_p"),
            tf.TensorSpec([None], tf.int64, name="seed"),
        ]
    )
    def sample(inputs, temperature, top_k, top_p, seed):
        max_source_length, chunk_size, extra_length = limits
        texts, scores = sample_strings(
            model, tokenizer, inputs, temperature, top_k, top_p, seed,
            max_source_length, chunk_size, extra_length,
        )  # fmt: skip
        return {"translations": texts, "scores": scores}

    # Named parameters, not `*values`: a traced function with varargs refuses keyword calls.
    @tf.function(input_signature=[sentences_spec, *control_specs()])
    def controlled(
        inputs, no_repeat_ngram_size, repetition_penalty, min_length, max_length, disable_unk,
        banned_words,
    ):  # fmt: skip
        values = (no_repeat_ngram_size, repetition_penalty, min_length, max_length, disable_unk)
        controls = dict(zip(CONTROLS, (*values, banned_words), strict=True))
        tensors = control_tensors(sides(tokenizer)[1], inputs, controls)
        texts, scores = translate(inputs, beam_size, alpha, 1, controls=tensors)
        return {"translations": texts[:, 0], "scores": scores[:, 0]}

    return prefix, align, sample, controlled


def combined_signatures(translate, model, tokenizer, limits, lengths):
    """The `controlled_search` and `controlled_sample` signatures (see `saved_model`).

    Both take each sentence's prefix and decoding controls; `controlled_search`
    also a request's beam size, alpha and penalty form (scalars, as
    `translate`), and `controlled_sample` each sentence's sampling settings.

    Args:
        translate: callable `(sentences, beam_size, alpha, num_hypotheses,
            **options) -> translate_strings(...)` over the export's model.
        model, tokenizer: the export's model and tensorflow-text tokenizer.
        limits: `(max_source_length, chunk_size, extra_length)`, as
            `Translator` takes them.
        lengths: dict, the export's `translation.LENGTH_DEFAULTS`.

    Returns:
        two `tf.function`s with input signatures.
    """
    sentences_spec = tf.TensorSpec([None], tf.string, name=SIGNATURE_INPUT)
    prefixes_spec = tf.TensorSpec([None], tf.string, name="prefixes")
    target_tokenizer = sides(tokenizer)[1]

    def controls_of(inputs, prefixes, values):
        """The controls (`values` in `CONTROLS` order) as the searches take them."""
        check_rows(inputs, prefixes=prefixes)
        controls = dict(zip(CONTROLS, values, strict=True))
        return control_tensors(target_tokenizer, inputs, controls)

    @tf.function(
        input_signature=[
            sentences_spec, prefixes_spec, *control_specs(),
            tf.TensorSpec([], tf.int32, name="beam_size"),
            tf.TensorSpec([], tf.float32, name="alpha"),
            tf.TensorSpec([], tf.string, name="penalty_form"),
        ]
    )  # fmt: skip
    def controlled_search(
        inputs, prefixes, no_repeat_ngram_size, repetition_penalty, min_length, max_length,
        disable_unk, banned_words, beam_size, alpha, penalty_form,
    ):  # fmt: skip
        values = (no_repeat_ngram_size, repetition_penalty, min_length, max_length, disable_unk)
        tensors = controls_of(inputs, prefixes, (*values, banned_words))
        tf.debugging.assert_positive(beam_size, message="beam_size must be positive")
        form = {**lengths, "penalty_form": form_offset(penalty_form, lengths["penalty_form"])}
        texts, scores = translate(
            inputs, beam_size, alpha, 1, prefixes=prefixes, controls=tensors, lengths=form
        )
        return {"translations": texts[:, 0], "scores": scores[:, 0]}

    @tf.function(
        input_signature=[
            sentences_spec, prefixes_spec, *control_specs(),
            tf.TensorSpec([None], tf.float32, name="temperature"),
            tf.TensorSpec([None], tf.int32, name="top_k"),
            tf.TensorSpec([None], tf.float32, name="top_p"),
            tf.TensorSpec([None], tf.int64, name="seed"),
        ]
    )  # fmt: skip
    def controlled_sample(
        inputs, prefixes, no_repeat_ngram_size, repetition_penalty, min_length, max_length,
        disable_unk, banned_words, temperature, top_k, top_p, seed,
    ):  # fmt: skip
        values = (no_repeat_ngram_size, repetition_penalty, min_length, max_length, disable_unk)
        tensors = controls_of(inputs, prefixes, (*values, banned_words))
        texts, scores = sample_strings(
            model, tokenizer, inputs, temperature, top_k, top_p, seed, *limits,
            prefixes=prefixes, controls=tensors,
        )  # fmt: skip
        return {"translations": texts, "scores": scores}

    return controlled_search, controlled_sample
