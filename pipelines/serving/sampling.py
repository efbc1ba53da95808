"""Sampling in the graph: strings -> ids -> draws -> strings, each sentence with its own settings.

What the SavedModel's `sample` and `controlled_sample` signatures run: the
sentences are tokenized, sorted by length and sampled chunk by chunk as
`translation.translate_strings` searches them, with a sentence's temperature,
top-k, top-p, seed, and (for `controlled_sample`) its target prefix and
decoding controls.
"""

import tensorflow as tf

from keras_transformer.decoding import sample
from pipelines.data.tokenizer import sides
from pipelines.serving.controls import controls_on
from pipelines.serving.rows import check_rows, refuse_rows
from pipelines.serving.translation import (
    CHUNK_SIZE,
    EXTRA_LENGTH,
    blank_sentences,
    by_length_chunks,
    decode,
    encode,
    prefix_ids,
)


def sample_strings(
    model,
    tokenizer,
    sentences,
    temperature,
    top_k,
    top_p,
    seeds,
    max_source_length=None,
    chunk_size=CHUNK_SIZE,
    extra_length=EXTRA_LENGTH,
    prefixes=None,
    controls=None,
):
    """One sample a sentence, drawn in the graph with each sentence's own settings and seed.

    A sentence's sample depends only on the sentence, its settings and its
    seed: not on the other sentences of the request, their order or the
    chunk it is drawn in (its uniforms come from its seed through
    TensorFlow's stateless generator). Draw several samples of a sentence by
    repeating it with different seeds.

    Args:
        model: a trained `Transformer`.
        tokenizer: the tensorflow-text tokenizer it was trained with, or a
            `Sides` of two.
        sentences: string `(B,)`.
        temperature: float32 `(B,)`, each > 0.
        top_k: int32 `(B,)`, each >= 0 (0: no cut).
        top_p: float32 `(B,)`, each in (0, 1].
        seeds: int64 `(B,)`.
        max_source_length: int or None, source ids kept (EOS included).
        chunk_size: int, the most sentences sampled at once.
        extra_length: int, target pieces beyond the source pieces.
        prefixes: string `(B,)` or None: each sample starts with its prefix's
            pieces ("" for none), forced and scored.
        controls: dict or None, decoding controls with one value a sentence,
            from `controls.control_tensors`; where every sentence's are off,
            the sampler without them runs.

    Returns:
        `(texts, scores)`: string `(B,)` and float32 `(B,)` log-probabilities
        of the samples under the model (untempered, unfiltered; under
        controls, of the distribution they cut).
    """
    sentences = tf.convert_to_tensor(sentences, tf.string)
    settings = {
        "temperature": tf.convert_to_tensor(temperature, tf.float32),
        "top_k": tf.convert_to_tensor(top_k, tf.int32),
        "top_p": tf.convert_to_tensor(top_p, tf.float32),
        "seed": tf.convert_to_tensor(seeds, tf.int64),
    }
    check_rows(sentences, **settings)
    checks = [
        (settings["temperature"] > 0, "temperature must be positive"),
        (settings["top_k"] >= 0, "top_k must be 0 (off) or positive"),
        ((settings["top_p"] > 0) & (settings["top_p"] <= 1), "top_p must be in (0, 1]"),
    ]
    for valid, message in checks:
        refuse_rows(~valid, f"{message}; rows:")
    source_tokenizer, target_tokenizer = sides(tokenizer)
    source = encode(source_tokenizer, sentences, model.eos_id, max_source_length)  # (B, None)
    prefix = None
    if prefixes is not None:
        prefix = prefix_ids(target_tokenizer, prefixes, source, extra_length)

    def sample_chunk(rows):
        source_ids = tf.gather(source, rows).to_tensor(model.pad_id)  # (C, S)
        width = tf.shape(source_ids)[1] + extra_length

        def uniforms(seed):  # a prefix of one stream per seed, whatever the width
            return tf.random.stateless_uniform([width], tf.stack([seed, tf.constant(0, tf.int64)]))

        row_uniforms = tf.map_fn(
            uniforms, tf.gather(settings["seed"], rows), fn_output_signature=tf.float32
        )  # (C, T)
        options = {
            "temperature": tf.gather(settings["temperature"], rows),
            "top_k": tf.gather(settings["top_k"], rows),
            "top_p": tf.gather(settings["top_p"], rows),
            "extra_length": extra_length,
            "uniforms": row_uniforms[:, None],
        }
        if prefix is not None:  # one pad column at least: prefixes may all be empty
            target_prefix = tf.gather(prefix, rows).to_tensor(model.pad_id)  # (C, P)
            options["target_prefix"] = tf.pad(
                target_prefix, [[0, 0], [0, 1]], constant_values=model.pad_id
            )

        def draw(controls=None):
            tokens, scores = sample(model, source_ids, controls=controls, **options)
            return decode(target_tokenizer, tokens[:, 0], model.eos_id), scores[:, 0]

        if controls is None:
            return draw()
        rows_controls = {name: tf.gather(value, rows) for name, value in controls.items()}
        return tf.cond(controls_on(rows_controls), lambda: draw(rows_controls), draw)

    texts, scores = by_length_chunks(
        source.row_lengths(), chunk_size, sample_chunk, [(tf.string, [None]), (tf.float32, [None])]
    )
    empty = blank_sentences(sentences)
    return tf.where(empty, "", texts), tf.where(empty, 0.0, scores)
