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
from pipelines.data.tokenizer import sides
from pipelines.serving.controls import controls_on
from pipelines.serving.rows import refuse_rows

# Target pieces a sentence may produce beyond its source pieces by default
# (section 6.1: input length + 50); a parser's run sets its own (`extra_length`).
EXTRA_LENGTH = 50

# Sentences searched together: enough rows for each step's matrix products to
# pay for its fixed costs, few enough that one chunk's caches stay small
# (chosen on Multi30k val; the comparison is in benchmarks/studies/decoding-threads.md).
CHUNK_SIZE = 128

# How a translation's length counts, by default (`translate_strings`' `lengths`).
LENGTH_DEFAULTS = {"penalty_form": "gnmt", "max_output_length": 0, "end_at_limit": False}


def search(
    model,
    source_ids,
    beam_size,
    alpha,
    num_hypotheses,
    use_cache=True,
    early_stop=False,
    target_prefix=None,
    return_attention=False,
    extra_length=EXTRA_LENGTH,
    constraint=None,
    controls=None,
    penalty_form="gnmt",
    max_output_length=None,
    end_at_limit=False,
):
    """Beam search, or greedy search for beam size 1 (the same results, tested).

    Args:
        model: a `Transformer`.
        source_ids: int32 `(B, S)`.
        beam_size: int, or int32 scalar tensor chosen at run time.
        alpha: float or float32 scalar, length penalty exponent.
        num_hypotheses: int `N`.
        use_cache: bool, False for the prefix-recomputing reference decoder.
        early_stop: bool, beam search's early stopping rule (see `beam_search`).
        target_prefix: int32 `(B, P)` forced first tokens padded with
            `model.pad_id`, or None.
        return_attention: bool, also return alignments.
        extra_length: int, target tokens beyond the source length.
        constraint: callable or None, restricts each next token (see
            `greedy_search`), such as a parser's `BracketConstraint`.
        controls: dict or None, the searches' decoding controls by name,
            one value a sentence (`controls.control_tensors`). Where every
            sentence's are off, the search without controls runs, which
            costs nothing for them.
        penalty_form: "gnmt" or "power", or a float32 scalar offset, the
            length penalty's form (`keras_transformer.length_penalty`).
        max_output_length: int or None, the most target tokens of every
            sentence, instead of its source length plus `extra_length`.
        end_at_limit: bool, a sentence's last allowed token is the end token
            (see `beam_search`).

    Returns:
        `(tokens, scores)`: int32 `(B, N, T)` and float32 `(B, N)`; with
        `return_attention`, float32 `(B, N, T, S)` alignments third.
    """
    options = {
        "target_prefix": target_prefix,
        "return_attention": return_attention,
        "extra_length": extra_length,
        "constraint": constraint,
        "penalty_form": penalty_form,
        "max_output_length": max_output_length,
        "end_at_limit": end_at_limit,
    }
    arguments = (model, source_ids, beam_size, alpha, num_hypotheses, use_cache, early_stop)
    if controls is None:
        return _search(*arguments, options)
    return tf.cond(
        controls_on(controls),
        lambda: _search(*arguments, {**options, "controls": controls}),
        lambda: _search(*arguments, options),
    )


def _search(model, source_ids, beam_size, alpha, num_hypotheses, use_cache, early_stop, options):
    """`search` with the searches' keyword arguments in `options`."""

    def greedy():
        results = greedy_search(
            model, source_ids, alpha=alpha, use_cache=use_cache, return_scores=True, **options
        )  # (B, T), (B,)[, (B, T, S)]
        # One hypothesis, repeated.
        return tuple(tf.repeat(tensor[:, None], num_hypotheses, axis=1) for tensor in results)

    def beam():
        return beam_search(
            model,
            source_ids,
            beam_size=beam_size,
            alpha=alpha,
            num_hypotheses=num_hypotheses,
            use_cache=use_cache,
            early_stop=early_stop,
            **options,
        )

    if isinstance(beam_size, int):
        return greedy() if beam_size == 1 else beam()
    return tf.cond(tf.equal(beam_size, 1), greedy, beam)


def encode(tokenizer, sentences, eos_id, max_source_length=None):
    """UTF-8-repaired sentences to ragged source ids, as training encodes them.

    Args:
        tokenizer: a tensorflow-text SentencePiece tokenizer.
        sentences: string `(B,)`; bytes that are not UTF-8 become U+FFFD.
        eos_id: int, appended to every source; None appends nothing (a
            target prefix).
        max_source_length: int or None, the most ids kept per source (EOS included).

    Returns:
        int32 ragged `(B, None)` ids.
    """
    sentences = tf.strings.unicode_transcode(
        sentences, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
    )
    pieces = tf.cast(tokenizer.tokenize(sentences), tf.int32)  # ragged (B, None)
    if eos_id is None:
        return pieces
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
    prefixes=None,
    return_alignments=False,
    extra_length=EXTRA_LENGTH,
    constraint=None,
    controls=None,
    lengths=None,
):
    """Translates a batch of sentences in the graph, chunk by chunk, in input order.

    An empty (or all-space) sentence translates to "" with score 0; a source
    longer than `max_source_length` ids is cut to that length; an empty batch
    gives empty outputs.

    Args:
        model: a trained `Transformer`.
        tokenizer: the tensorflow-text tokenizer it was trained with, or a
            `Sides` of two.
        sentences: string `(B,)`.
        beam_size: int or int32 scalar; 1 runs greedy search.
        alpha: float or float32 scalar, length penalty exponent.
        num_hypotheses: int `N`, hypotheses returned per sentence.
        max_source_length: int or None, source ids kept (EOS included).
        chunk_size: int, the most sentences searched at once.
        use_cache: bool, False for the prefix-recomputing reference decoder.
        early_stop: bool, beam search's early stopping rule (see `beam_search`).
        prefixes: string `(B,)` or None: each translation starts with its
            prefix's pieces ("" for none), forced and scored (`target_prefix`
            of the searches). A prefix may hold at most the sentence's output
            limit of pieces (its source pieces, EOS included, plus
            `extra_length`).
        return_alignments: bool, also return alignments (see Returns).
        extra_length: int, target pieces a sentence may produce beyond its
            source pieces (EOS included).
        constraint: callable or None, restricts each next token (see
            `greedy_search`).
        controls: dict or None, decoding controls with one value a sentence,
            from `controls.control_tensors`.
        lengths: dict or None, how lengths count (`LENGTH_DEFAULTS`):
            `penalty_form` ("gnmt", "power", or a float32 scalar offset),
            `max_output_length` (int, the most target pieces of every
            sentence, EOS included, instead of its source pieces plus
            `extra_length`; 0 for none) and `end_at_limit` (bool, a
            sentence's last allowed piece is the end; see `beam_search`).

    Returns:
        `(texts, scores)`: string `(B, N)` and float32 `(B, N)`, best first;
        scores are log-probabilities divided by the length penalty.
        With `return_alignments`, also a dict of `alignments` int32
        `(B, N, T)`, for each target piece the source piece it attends to
        most (last decoder layer, heads averaged), -1 where that is the
        source's end or past the target's pieces; `target_pieces` string
        `(B, N, T)` ("" past the end); `source_pieces` string `(B, S)`.
        End-of-sentence tokens are left out of pieces and positions.
    """
    sentences = tf.convert_to_tensor(sentences, tf.string)
    source_tokenizer, target_tokenizer = sides(tokenizer)
    source = encode(source_tokenizer, sentences, model.eos_id, max_source_length)  # (B, None)
    lengths = {**LENGTH_DEFAULTS, **(lengths or {})}
    fixed = lengths["max_output_length"] = lengths["max_output_length"] or None  # one for all
    prefix = None
    if prefixes is not None:
        ends = lengths["end_at_limit"]
        prefix = prefix_ids(target_tokenizer, prefixes, source, extra_length, fixed, ends)
    # The widest output and source of any chunk, so that every chunk's
    # alignments can be padded to one width.
    source_width = tf.cast(_most(source.row_lengths()), tf.int32)
    target_width = source_width + extra_length if fixed is None else fixed

    def translate_chunk(rows):
        source_ids = tf.gather(source, rows).to_tensor(model.pad_id)  # (C, S)
        target_prefix = None
        if prefix is not None:  # one pad column at least: prefixes may all be empty
            target_prefix = tf.gather(prefix, rows).to_tensor(model.pad_id)  # (C, P)
            target_prefix = tf.pad(target_prefix, [[0, 0], [0, 1]], constant_values=model.pad_id)
        options = (use_cache, early_stop, target_prefix, return_alignments, extra_length)
        rows_controls = controls and {name: tf.gather(v, rows) for name, v in controls.items()}
        # (C, N, T), (C, N)[, (C, N, T, S)]
        results = search(
            model, source_ids, beam_size, alpha, num_hypotheses, *options, constraint=constraint,
            controls=rows_controls, **lengths,
        )  # fmt: skip
        texts = decode(target_tokenizer, results[0], model.eos_id)
        if not return_alignments:
            return texts, results[1]
        positions = _alignment_positions(model, source_ids, results[2])  # (C, N, T)
        pad = [[0, 0], [0, 0], [0, target_width - tf.shape(positions)[2]]]
        tokens = tf.pad(results[0], pad, constant_values=model.pad_id)
        return texts, results[1], tokens, tf.pad(positions, pad, constant_values=-1)

    shape = [None, num_hypotheses]
    outputs = [(tf.string, shape), (tf.float32, shape)]
    if return_alignments:
        outputs += [(tf.int32, [None, num_hypotheses, None])] * 2
    texts, scores, *aligned = by_length_chunks(
        source.row_lengths(), chunk_size, translate_chunk, outputs
    )  # (B, N) each[, (B, N, T) twice]
    empty = blank_sentences(sentences)  # (B,)
    texts, scores = tf.where(empty[:, None], "", texts), tf.where(empty[:, None], 0.0, scores)
    if not return_alignments:
        return texts, scores
    tokens, positions = aligned
    real = _pieces_mask(model, tokens) & ~empty[:, None, None]  # (B, N, T)
    width = _most(tf.reduce_sum(tf.cast(real, tf.int32), 2))  # the most target pieces
    source_ids = source.to_tensor(model.pad_id)  # (B, S)
    source_real = _pieces_mask(model, source_ids) & ~empty[:, None]
    source_used = _most(tf.reduce_sum(tf.cast(source_real, tf.int32), 1))
    source_pieces = tf.where(source_real, source_tokenizer.id_to_string(source_ids), "")
    target_pieces = tf.where(real, target_tokenizer.id_to_string(tokens), "")
    alignments = {
        "alignments": tf.where(real, positions, -1)[:, :, :width],
        "target_pieces": target_pieces[:, :, :width],
        "source_pieces": source_pieces[:, :source_used],
    }
    return texts, scores, alignments


def prefix_ids(tokenizer, prefixes, source, extra_length, fixed=None, ends=False):
    """Target prefixes as ragged ids, each checked against its sentence's output limit.

    Args:
        tokenizer: the tensorflow-text target tokenizer.
        prefixes: string `(B,)`, "" for none.
        source: int32 ragged `(B, None)` source ids (`encode`).
        extra_length: int, target pieces beyond the source pieces.
        fixed: int or None, one output limit for every sentence instead.
        ends: bool, the last allowed piece is a forced end (one piece less).

    Returns:
        int32 ragged `(B, None)`; an error names the rows whose prefix
        outgrows its limit.
    """
    prefix = encode(tokenizer, tf.convert_to_tensor(prefixes, tf.string), None)
    limits = source.row_lengths() + extra_length if fixed is None else fixed
    limit = fixed or f"the source's pieces, end of sentence included, plus {extra_length}"
    refuse_rows(
        prefix.row_lengths() > limits - int(bool(ends)),
        f"a prefix has more pieces than its sentence's output limit ({limit}"
        f"{', less its forced end' if ends else ''}); rows:",
    )
    return prefix


def blank_sentences(sentences):
    """Which sentences are empty or all ASCII whitespace: those translate to "".

    Args:
        sentences: string `(B,)`.

    Returns:
        bool `(B,)`.
    """
    return tf.equal(tf.strings.length(tf.strings.strip(sentences)), 0)


def _most(counts):
    """The largest of `counts` (any shape), 0 when there are none."""
    return tf.reduce_max(tf.concat([tf.reshape(counts, [-1]), [0]], 0))


def _pieces_mask(model, token_ids):
    """True at the pieces of `token_ids` `(..., T)`: before the first EOS, not padding."""
    before_eos = tf.math.cumsum(tf.cast(tf.equal(token_ids, model.eos_id), tf.int32), axis=-1) == 0
    return before_eos & tf.not_equal(token_ids, model.pad_id)


def _alignment_positions(model, source_ids, attention):
    """The source position `attention` `(C, N, T, S)` favours for each target position: `(C, N, T)`.

    -1 where that position is the source's end of sentence (or padding).
    """
    positions = tf.argmax(attention, axis=-1, output_type=tf.int32)  # (C, N, T)
    source_pieces = _pieces_mask(model, source_ids)  # (C, S)
    on_piece = tf.gather(source_pieces, positions, batch_dims=1)  # (C, N, T)
    return tf.where(on_piece, positions, -1)


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
        tokenizer: the tensorflow-text tokenizer it was trained with, or a
            `Sides` of two.
        sources, targets: string `(B,)`, aligned.
        max_source_length: int or None, source ids kept (EOS included).
        chunk_size: int, the most pairs scored at once.

    Returns:
        `(scores, lengths)`: float32 `(B,)` log-probabilities and int32 `(B,)`
        target tokens scored (EOS included), in input order.
    """
    sources = tf.convert_to_tensor(sources, tf.string)
    source_tokenizer, target_tokenizer = sides(tokenizer)
    source = encode(source_tokenizer, sources, model.eos_id, max_source_length)  # (B, None)
    target = encode(target_tokenizer, tf.convert_to_tensor(targets, tf.string), model.eos_id)

    def score_chunk(rows):
        source_ids = tf.gather(source, rows).to_tensor(model.pad_id)  # (C, S)
        target_ids = tf.gather(target, rows).to_tensor(model.pad_id)  # (C, T)
        return (score_hypotheses(model, source_ids, target_ids),)

    lengths = source.row_lengths() + target.row_lengths()
    (scores,) = by_length_chunks(lengths, chunk_size, score_chunk, [(tf.float32, [None])])
    return scores, tf.cast(target.row_lengths(), tf.int32)


def by_length_chunks(lengths, chunk_size, compute, outputs, parallel_chunks=1):
    """`compute` on chunks of rows of similar length, one chunk at a time, results in input order.

    Sorting by length keeps each chunk's padding small; one chunk at a time
    bounds memory whatever the request's size (parallel iterations would hold
    several chunks' caches, and on 2 CPU cores two chunks in flight were no
    faster: benchmarks/studies/decoding-threads.md).

    Args:
        lengths: int `(B,)`, each row's length.
        chunk_size: int, the most rows a chunk.
        compute: callable `rows (C,) -> tuple of (C, ...) tensors`.
        outputs: list of `(dtype, element_shape)`, one for each tensor
            `compute` returns (`element_shape` leaves out nothing: `[None, N]`
            for `(C, N)`).
        parallel_chunks: int, chunks the loop may compute at once.

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
        lambda chunk, *_: chunk < chunks,
        body,
        (tf.constant(0), *arrays),
        parallel_iterations=parallel_chunks,
    )
    inverse = tf.math.invert_permutation(order)
    return tuple(tf.gather(array.concat(), inverse) for array in arrays)
