"""The translation path: strings -> ids -> search -> strings, in one TensorFlow graph.

`translate_strings` is what the exported SavedModel runs, what in-process
evaluation and the benchmarks call, and what the tests compare the export
against. It repairs UTF-8, tokenizes, sorts the batch by length, translates it
in chunks of at most `chunk_size` sentences, one chunk after another, and
returns the translations in input order. Memory therefore depends on the chunk
size and the longest sentence allowed, not on how many sentences a request
holds, and sentences of similar length share a chunk.
"""

import tensorflow as tf

from keras_transformer.decoding import beam_search, greedy_search, score_hypotheses

# Sentences searched together: enough rows for each step's matrix products to
# pay for its fixed costs, few enough that one chunk's caches stay small
# (chosen on Multi30k val; the comparison is in benchmarks/README.md).
CHUNK_SIZE = 128


def search(model, source_ids, beam_size, alpha, num_hypotheses, use_cache=True, early_stop=False):
    """Beam search, or greedy search for beam size 1 (the same results, tested).

    Args:
        model: a `Transformer`.
        source_ids: int32 `(B, S)`.
        beam_size: int, or int32 scalar tensor chosen at run time.
        alpha: float or float32 scalar, length penalty exponent.
        num_hypotheses: int `N`.
        use_cache: bool, False for the prefix-recomputing reference decoder.
        early_stop: bool, beam search's early stopping rule (see `beam_search`).

    Returns:
        `(tokens, scores)`: int32 `(B, N, T)` and float32 `(B, N)`.
    """

    def greedy():
        tokens, scores = greedy_search(
            model, source_ids, alpha=alpha, use_cache=use_cache, return_scores=True
        )
        tokens = tf.tile(tokens[:, None], [1, num_hypotheses, 1])  # one hypothesis, repeated
        return tokens, tf.tile(scores[:, None], [1, num_hypotheses])

    def beam():
        return beam_search(
            model,
            source_ids,
            beam_size=beam_size,
            alpha=alpha,
            num_hypotheses=num_hypotheses,
            use_cache=use_cache,
            early_stop=early_stop,
        )

    if isinstance(beam_size, int):
        return greedy() if beam_size == 1 else beam()
    return tf.cond(tf.equal(beam_size, 1), greedy, beam)


def encode(tokenizer, sentences, eos_id, max_source_length=None):
    """UTF-8-repaired sentences to ragged source ids, as training encodes them.

    Args:
        tokenizer: a tensorflow-text SentencePiece tokenizer.
        sentences: string `(B,)`; bytes that are not UTF-8 become U+FFFD.
        eos_id: int, appended to every source.
        max_source_length: int or None, the most ids kept per source (EOS included).

    Returns:
        int32 ragged `(B, None)` ids.
    """
    sentences = tf.strings.unicode_transcode(
        sentences, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )
    pieces = tf.cast(tokenizer.tokenize(sentences), tf.int32)  # ragged (B, None)
    if max_source_length:
        pieces = pieces[:, : max_source_length - 1]
    eos = tf.fill([tf.shape(sentences)[0], 1], eos_id)
    return tf.concat([pieces, eos], axis=1)


def decode(tokenizer, token_ids, eos_id):
    """Detokenizes `(..., T)` hypotheses, dropping EOS and what follows it.

    Returns:
        string tensor of shape `token_ids.shape[:-1]`.
    """
    shape = tf.shape(token_ids)
    flat = tf.reshape(token_ids, [-1, shape[-1]])  # (R, T)
    keep = tf.math.cumsum(tf.cast(tf.equal(flat, eos_id), tf.int32), axis=1) == 0
    texts = tokenizer.detokenize(tf.ragged.boolean_mask(flat, keep))  # (R,)
    return tf.reshape(texts, shape[:-1])


def translate_strings(
    model,
    tokenizer,
    sentences,
    beam_size=4,
    alpha=0.6,
    num_hypotheses=1,
    max_source_length=None,
    chunk_size=CHUNK_SIZE,
    use_cache=True,
    early_stop=False,
):
    """Translates a batch of sentences in the graph, chunk by chunk, in input order.

    An empty (or all-space) sentence translates to "" with score 0; a source
    longer than `max_source_length` ids is cut to that length; an empty batch
    gives empty outputs.

    Args:
        model: a trained `Transformer`.
        tokenizer: the tensorflow-text tokenizer it was trained with.
        sentences: string `(B,)`.
        beam_size: int or int32 scalar; 1 runs greedy search.
        alpha: float or float32 scalar, length penalty exponent.
        num_hypotheses: int `N`, hypotheses returned per sentence.
        max_source_length: int or None, source ids kept (EOS included).
        chunk_size: int, the most sentences searched at once.
        use_cache: bool, False for the prefix-recomputing reference decoder.
        early_stop: bool, beam search's early stopping rule (see `beam_search`).

    Returns:
        `(texts, scores)`: string `(B, N)` and float32 `(B, N)`, best first;
        scores are log-probabilities divided by the GNMT length penalty.
    """
    sentences = tf.convert_to_tensor(sentences, tf.string)
    source = encode(tokenizer, sentences, model.eos_id, max_source_length)  # ragged (B, None)

    def translate_chunk(rows):
        source_ids = tf.gather(source, rows).to_tensor(model.pad_id)  # (C, S)
        tokens, scores = search(
            model, source_ids, beam_size, alpha, num_hypotheses, use_cache, early_stop
        )  # (C, N, T), (C, N)
        return decode(tokenizer, tokens, model.eos_id), scores

    shape = [None, num_hypotheses]
    texts, scores = by_length_chunks(
        source.row_lengths(), chunk_size, translate_chunk, [(tf.string, shape), (tf.float32, shape)]
    )  # (B, N) each
    empty = tf.equal(tf.strings.length(tf.strings.strip(sentences)), 0)[:, None]  # (B, 1)
    return tf.where(empty, "", texts), tf.where(empty, 0.0, scores)


def score_strings(
    model, tokenizer, sources, targets, max_source_length=None, chunk_size=CHUNK_SIZE
):
    """Scores given translations in the graph (forced decoding), chunk by chunk.

    Each target is tokenized as training tokenizes it, EOS appended, and
    scored by `score_hypotheses` with no length penalty: the sum of its
    tokens' log-probabilities given the source. Beam search's own outputs
    score as beam search scored them (with `alpha=0`).

    Args:
        model: a trained `Transformer`.
        tokenizer: the tensorflow-text tokenizer it was trained with.
        sources, targets: string `(B,)`, aligned.
        max_source_length: int or None, source ids kept (EOS included).
        chunk_size: int, the most pairs scored at once.

    Returns:
        `(scores, lengths)`: float32 `(B,)` log-probabilities and int32 `(B,)`
        target tokens scored (EOS included), in input order.
    """
    sources = tf.convert_to_tensor(sources, tf.string)
    source = encode(tokenizer, sources, model.eos_id, max_source_length)  # ragged (B, None)
    target = encode(tokenizer, tf.convert_to_tensor(targets, tf.string), model.eos_id)

    def score_chunk(rows):
        source_ids = tf.gather(source, rows).to_tensor(model.pad_id)  # (C, S)
        target_ids = tf.gather(target, rows).to_tensor(model.pad_id)  # (C, T)
        return (score_hypotheses(model, source_ids, target_ids),)

    lengths = source.row_lengths() + target.row_lengths()
    (scores,) = by_length_chunks(lengths, chunk_size, score_chunk, [(tf.float32, [None])])
    return scores, tf.cast(target.row_lengths(), tf.int32)


def by_length_chunks(lengths, chunk_size, compute, outputs):
    """`compute` on chunks of rows of similar length, one chunk at a time, results in input order.

    Sorting by length keeps each chunk's padding small; one chunk at a time
    bounds memory whatever the request's size (parallel iterations would hold
    several chunks' caches).

    Args:
        lengths: int `(B,)`, each row's length.
        chunk_size: int, the most rows a chunk.
        compute: callable `rows (C,) -> tuple of (C, ...) tensors`.
        outputs: list of `(dtype, element_shape)`, one for each tensor
            `compute` returns (`element_shape` leaves out nothing: `[None, N]`
            for `(C, N)`).

    Returns:
        tuple of `(B, ...)` tensors, row `i` computed for row `i`.
    """
    # Stable, so equal lengths keep their input order and results do not
    # depend on how a request was split.
    order = tf.argsort(lengths, stable=True)  # (B,)
    chunks = (tf.size(order) + chunk_size - 1) // chunk_size

    def body(chunk, *arrays):
        rows = order[chunk * chunk_size : (chunk + 1) * chunk_size]  # (C,)
        results = compute(rows)
        return (chunk + 1, *(a.write(chunk, r) for a, r in zip(arrays, results, strict=True)))

    arrays = [
        tf.TensorArray(dtype, size=chunks, infer_shape=False, element_shape=shape)
        for dtype, shape in outputs
    ]
    _, *arrays = tf.while_loop(
        lambda chunk, *_: chunk < chunks, body, (tf.constant(0), *arrays), parallel_iterations=1
    )
    inverse = tf.math.invert_permutation(order)
    return tuple(tf.gather(array.concat(), inverse) for array in arrays)
