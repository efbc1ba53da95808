"""Greedy and beam search (section 6.1) on `ops.while_loop`, with the decoder's cache.

Both decoders run a whole batch at once and stop early once every sentence has
finished. Each sentence may produce at most its own source length plus
`extra_length` tokens (50 in the paper), so padding a batch changes no result.
With `use_cache=True` (the default) every step runs the decoder on one position
and reads earlier keys and values from a fixed-shape cache; `use_cache=False`
recomputes the whole prefix at every step instead, the slow reference the
cached decoders are checked and measured against.

Hypotheses are scored by their log-probability divided by the GNMT length
penalty `((5 + |Y|) / 6) ** alpha` (Wu et al., 2016), where `|Y|` counts the
produced tokens, end-of-sequence included. `pad_id` and `bos_id` are never
produced.
"""

import keras
from keras import ops

# Log-probability of an impossible hypothesis; finite so sums stay finite.
_IMPOSSIBLE = -1e9


def length_penalty(length, alpha):
    """The GNMT length penalty `((5 + length) / 6) ** alpha`.

    Args:
        length: int or tensor of token counts (end-of-sequence included).
        alpha: float, 0 for none; the paper uses 0.6.

    Returns:
        float32 tensor shaped like `length`.

    References:
        Wu et al., 2016, section 7; Vaswani et al., 2017, section 6.1.
    """
    length = ops.cast(length, "float32")
    return ops.power((5.0 + length) / 6.0, alpha)


def _source_limits(model, source_ids, max_length, extra_length):
    """Per-sentence `(B,)` limits and the width `T` of the output buffer.

    The buffer is as wide as the longest possible output, `S + extra_length`
    for a padded width `S`, so its shape is static wherever `S` is (as under
    `jax.jit`); each sentence still stops at its own limit.
    """
    if max_length is not None:
        limits = ops.full((ops.shape(source_ids)[0],), max_length, dtype="int32")
        return limits, max_length
    lengths = ops.sum(ops.cast(model.padding_mask(source_ids), "int32"), axis=1)  # (B,)
    return lengths + extra_length, ops.shape(source_ids)[1] + extra_length


class _Stepper:
    """Log-probabilities of the next token, with or without the cache."""

    def __init__(self, model, source_ids, copies, buffer_length, use_cache):
        self.model = model
        self.use_cache = use_cache
        encoder_outputs, source_mask = model.encode(source_ids)
        if use_cache:
            cross = model.decoder.compute_cross_attention_cache(encoder_outputs)
            self.cross_cache = ops.repeat(cross, copies, axis=0)  # (B * C, L, 2, S, H, K)
        self.encoder_outputs = ops.repeat(encoder_outputs, copies, axis=0)  # (B * C, S, D)
        self.source_mask = ops.repeat(source_mask, copies, axis=0)  # (B * C, S)
        rows = ops.shape(source_ids)[0] * copies
        if use_cache:
            self.initial_state = model.decoder.initial_cache(rows, buffer_length)
        else:  # Nothing to carry; a zero-size tensor keeps the loop's structure.
            self.initial_state = ops.zeros((rows, 0), dtype="float32")

    def __call__(self, tokens, index, state):
        """`tokens` int `(R, 1 + T)`, `index` int scalar -> `(R, V)` log-probs, state."""
        rows = ops.shape(tokens)[0]
        if self.use_cache:
            step_ids = ops.slice(tokens, [0, index], [rows, 1])  # (R, 1)
            logits, state = self.model.decode(
                step_ids,
                self.encoder_outputs,
                self.source_mask,
                self_attention_cache=state,
                cache_update_index=index,
                cross_attention_cache=self.cross_cache,
            )  # (R, 1, V)
            logits = logits[:, 0]
        elif keras.backend.backend() == "jax":
            # XLA needs static shapes: run the whole buffer, read one position.
            logits = self.model.decode(tokens, self.encoder_outputs, self.source_mask)
            logits = ops.slice(logits, [0, index, 0], [rows, 1, ops.shape(logits)[2]])[:, 0]
        else:
            prefix = ops.slice(tokens, [0, 0], [rows, index + 1])  # (R, index + 1)
            logits = self.model.decode(prefix, self.encoder_outputs, self.source_mask)[:, -1]
        log_probs = ops.log_softmax(logits, axis=-1)  # (R, V)
        ids = ops.arange(ops.shape(log_probs)[-1])
        banned = ops.equal(ids, self.model.pad_id) | ops.equal(ids, self.model.bos_id)  # (V,)
        return ops.where(banned, _IMPOSSIBLE, log_probs), state


def _write_column(tokens, index, ids):
    """Sets `tokens[..., index] = ids`. `where`, not `ops.slice_update`, which
    TensorFlow lowers to XlaDynamicUpdateSlice, an op TF Serving runs only
    with XLA compilation enabled."""
    column = ops.arange(ops.shape(tokens)[-1]) == index  # (1 + T,)
    return ops.where(column, ops.expand_dims(ids, -1), tokens)


def _initial_tokens(model, rows, buffer_length):
    """`(R, 1 + T)` buffer: BOS, then padding."""
    return ops.concatenate(
        [
            ops.full((rows, 1), model.bos_id, dtype="int32"),
            ops.full((rows, buffer_length), model.pad_id, dtype="int32"),
        ],
        axis=1,
    )


def greedy_search(
    model,
    source_ids,
    max_length=None,
    extra_length=50,
    alpha=0.0,
    use_cache=True,
    return_scores=False,
):
    """Decodes by taking the most probable token at every step.

    Args:
        model: a built `Transformer`.
        source_ids: int `(B, S)` source ids, padded with `model.pad_id`.
        max_length: int or None, the most target tokens for every sentence.
            Defaults to each sentence's source length plus `extra_length`.
        extra_length: int, see `max_length` (50 in section 6.1).
        alpha: float, length penalty exponent used for the returned scores
            only (greedy choices do not depend on it).
        use_cache: bool, read earlier steps from the key/value cache instead
            of recomputing the prefix.
        return_scores: bool, also return the scores.

    Returns:
        int32 `(B, T)` token ids, `T = max_length` or `S + extra_length`:
        each row ends with `model.eos_id` (when produced) followed by
        `model.pad_id`. With `return_scores`, also
        float32 `(B,)` log-probabilities divided by `length_penalty`.

    Example:
    >>> model = Transformer.from_preset(
    ...     "transformer_small", vocabulary_size=20)
    >>> model.build(((None, None), (None, None)))
    >>> tokens = greedy_search(model, keras.ops.array([[5, 6, 3, 0]]))
    >>> tuple(tokens.shape)  # S + 50; this sentence may use 3 + 50
    (1, 54)

    References:
        Vaswani et al., 2017, section 6.1.
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    batch_size = ops.shape(source_ids)[0]
    limits, buffer_length = _source_limits(model, source_ids, max_length, extra_length)
    step = _Stepper(model, source_ids, 1, buffer_length, use_cache)
    tokens = _initial_tokens(model, batch_size, buffer_length)  # (B, 1 + T)
    log_probs = ops.zeros((batch_size,), dtype="float32")
    lengths = ops.zeros((batch_size,), dtype="int32")
    finished = ops.zeros((batch_size,), dtype="bool")

    def condition(index, tokens, state, log_probs, lengths, finished):
        return ops.logical_and(index < buffer_length, ops.logical_not(ops.all(finished)))

    def body(index, tokens, state, log_probs, lengths, finished):
        step_log_probs, state = step(tokens, index, state)  # (B, V)
        next_ids = ops.cast(ops.argmax(step_log_probs, axis=-1), "int32")  # (B,)
        best = ops.max(step_log_probs, axis=-1)  # (B,)
        log_probs = log_probs + ops.where(finished, 0.0, best)
        lengths = lengths + ops.cast(ops.logical_not(finished), "int32")
        next_ids = ops.where(finished, model.pad_id, next_ids)
        tokens = _write_column(tokens, index + 1, next_ids)
        finished = finished | ops.equal(next_ids, model.eos_id) | (index + 1 >= limits)
        return index + 1, tokens, state, log_probs, lengths, finished

    loop_vars = (ops.convert_to_tensor(0, "int32"), tokens, step.initial_state)
    _, tokens, _, log_probs, lengths, _ = ops.while_loop(
        condition, body, loop_vars + (log_probs, lengths, finished)
    )
    if not return_scores:
        return tokens[:, 1:]
    return tokens[:, 1:], log_probs / length_penalty(lengths, alpha)


def _take_rows(values, indices):
    """Gathers `(B, C, ...)` values by `(B, N)` indices along axis 1."""
    extra_axes = len(values.shape) - 2
    indices = ops.reshape(indices, tuple(ops.shape(indices)) + (1,) * extra_axes)
    return ops.take_along_axis(values, indices, axis=1)


def beam_search(
    model,
    source_ids,
    beam_size=4,
    alpha=0.6,
    num_hypotheses=1,
    max_length=None,
    extra_length=50,
    use_cache=True,
):
    """Beam search with the GNMT length penalty, returning the N best.

    At each step every live hypothesis is extended by every token and the
    `2 * beam_size` best extensions are kept: those among the best
    `beam_size` that end with `model.eos_id` join the sentence's finished
    hypotheses, and the best `beam_size` that do not stay alive. A sentence is
    done once it has `beam_size` finished hypotheses and no live one scores
    better at its current length than the worst of them, or once it reaches its
    length limit (its live hypotheses then finish as they are); the loop stops
    once every sentence is done. With `beam_size=1` this is exactly greedy
    search.

    Args:
        model: a built `Transformer`.
        source_ids: int `(B, S)` source ids, padded with `model.pad_id`.
        beam_size: int, hypotheses kept per sentence (4 in section 6.1); a
            scalar tensor in TensorFlow graphs.
        alpha: float, length penalty exponent (0.6 in section 6.1).
        num_hypotheses: int, hypotheses returned per sentence, at most
            `beam_size`.
        max_length: int or None, the most target tokens for every sentence.
            Defaults to each sentence's source length plus `extra_length`.
        extra_length: int, see `max_length`.
        use_cache: bool, read earlier steps from the key/value cache instead
            of recomputing the prefix.

    Returns:
        `(tokens, scores)`: int32 `(B, N, T)` hypotheses (`T` as in
        `greedy_search`), best first, each ending with `model.eos_id` (when
        produced) then `model.pad_id`; and
        float32 `(B, N)` log-probabilities divided by `length_penalty`.

    Example:
    >>> model = Transformer.from_preset(
    ...     "transformer_small", vocabulary_size=20)
    >>> model.build(((None, None), (None, None)))
    >>> tokens, scores = beam_search(
    ...     model, keras.ops.array([[5, 6, 3]]), num_hypotheses=2)
    >>> tuple(tokens.shape), tuple(scores.shape)
    ((1, 2, 53), (1, 2))

    References:
        Vaswani et al., 2017, section 6.1; Wu et al., 2016, section 7.
    """
    if isinstance(beam_size, int) and beam_size < 1:
        raise ValueError(f"beam_size must be positive. Received: beam_size={beam_size}")
    if isinstance(beam_size, int) and not 1 <= num_hypotheses <= beam_size:
        raise ValueError(
            "num_hypotheses must be between 1 and beam_size. Received: "
            f"num_hypotheses={num_hypotheses}, beam_size={beam_size}"
        )
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    batch_size = ops.shape(source_ids)[0]
    limits, buffer_length = _source_limits(model, source_ids, max_length, extra_length)
    step = _Stepper(model, source_ids, beam_size, buffer_length, use_cache)
    tokens = _initial_tokens(model, batch_size * beam_size, buffer_length)
    tokens = ops.reshape(tokens, (batch_size, beam_size, -1))  # (B, K, 1 + T)
    # Only the first beam is alive at the start, so the first step's
    # candidates are distinct.
    first = ops.arange(beam_size) == 0
    alive_log_probs = ops.where(first, 0.0, _IMPOSSIBLE)[None] + ops.zeros((batch_size, 1))
    finished_scores = ops.full((batch_size, beam_size), _IMPOSSIBLE)
    done = ops.zeros((batch_size,), dtype="bool")

    def condition(index, *_):
        return ops.logical_and(index < buffer_length, ops.logical_not(ops.all(done)))

    def body(index, tokens, state, alive_log_probs, finished, finished_scores, done):
        flat_tokens = ops.reshape(tokens, (batch_size * beam_size, -1))
        step_log_probs, state = step(flat_tokens, index, state)  # (B * K, V)
        vocabulary = ops.shape(step_log_probs)[-1]
        candidates = alive_log_probs[..., None] + ops.reshape(
            step_log_probs, (batch_size, beam_size, vocabulary)
        )  # (B, K, V)
        candidates = ops.reshape(candidates, (batch_size, beam_size * vocabulary))
        top_log_probs, top_indices = ops.top_k(candidates, 2 * beam_size)  # (B, 2K)
        origins = top_indices // vocabulary  # (B, 2K) beam each candidate extends
        new_ids = ops.cast(top_indices % vocabulary, "int32")  # (B, 2K)
        extended = _take_rows(tokens, origins)  # (B, 2K, 1 + T)
        extended = _write_column(extended, index + 1, new_ids)
        ends = ops.equal(new_ids, model.eos_id)
        at_limit = (index + 1 >= limits)[:, None]  # (B, 1)

        # Finish the best K candidates that end here, or all alive ones at the limit.
        in_beam = (ops.arange(2 * beam_size) < beam_size)[None]  # (1, 2K)
        finishing = in_beam & (ends | at_limit) & ops.logical_not(done)[:, None]
        finishing = finishing & (top_log_probs > _IMPOSSIBLE / 2)
        new_scores = top_log_probs / length_penalty(index + 1, alpha)
        pooled_scores = ops.concatenate(
            [finished_scores, ops.where(finishing, new_scores, _IMPOSSIBLE)], axis=1
        )  # (B, 3K)
        finished_scores, keep = ops.top_k(pooled_scores, beam_size)  # (B, K)
        finished = _take_rows(ops.concatenate([finished, extended], axis=1), keep)

        # Keep the best K candidates that did not end.
        alive_log_probs, keep = ops.top_k(ops.where(ends, _IMPOSSIBLE, top_log_probs), beam_size)
        tokens = _take_rows(extended, keep)  # (B, K, 1 + T)
        parents = _take_rows(origins, keep) + ops.arange(batch_size)[:, None] * beam_size
        state = ops.take(state, ops.reshape(parents, (-1,)), axis=0)

        # Done once K hypotheses have finished and none alive scores better
        # now than the worst of them (Hugging Face's default rule). Stopping at
        # K finished alone lets unlikely early endings, which enter the top K
        # when the model is confident, end the search before its best
        # hypothesis has finished.
        worst_finished = finished_scores[:, -1]  # scores are sorted, best first
        best_alive = alive_log_probs[:, 0] / length_penalty(index + 1, alpha)
        settled = (worst_finished > _IMPOSSIBLE / 2) & (worst_finished >= best_alive)
        done = done | settled | at_limit[:, 0]
        return index + 1, tokens, state, alive_log_probs, finished, finished_scores, done

    loop_vars = (ops.convert_to_tensor(0, "int32"), tokens, step.initial_state, alive_log_probs)
    outputs = ops.while_loop(condition, body, loop_vars + (tokens, finished_scores, done))
    finished, finished_scores = outputs[4], outputs[5]
    return finished[:, :num_hypotheses, 1:], finished_scores[:, :num_hypotheses]


def score_hypotheses(model, source_ids, target_ids, alpha=0.0):
    """Scores given translations under the model, as the decoders score them.

    Args:
        model: a built `Transformer`.
        source_ids: int `(B, S)` source ids.
        target_ids: int `(B, T)` hypotheses as the decoders return them: tokens,
            then `model.eos_id` (when produced), then `model.pad_id`.
        alpha: float, length penalty exponent.

    Returns:
        float32 `(B,)` log-probabilities divided by `length_penalty`.
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    target_ids = ops.convert_to_tensor(target_ids, "int32")
    bos = ops.full((ops.shape(target_ids)[0], 1), model.bos_id, dtype="int32")
    inputs = ops.concatenate([bos, target_ids[:, :-1]], axis=1)  # (B, T)
    log_probs = ops.log_softmax(model((source_ids, inputs)), axis=-1)  # (B, T, V)
    picked = ops.take_along_axis(log_probs, target_ids[..., None], axis=-1)[..., 0]
    real = ops.not_equal(target_ids, model.pad_id)
    total = ops.sum(ops.where(real, picked, 0.0), axis=1)
    return total / length_penalty(ops.sum(ops.cast(real, "int32"), axis=1), alpha)
