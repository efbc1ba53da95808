"""Greedy and beam search (section 6.1) on `ops.while_loop`.

Both searches run a whole batch at once and step a decoder through the
interface `Transformer.start_decoding` / `Transformer.decoding_step`. Each
sentence may produce at most its own source length plus `extra_length` tokens
(50 in the paper), so padding a batch changes no result.

How the decoder state is carried depends on `static_shapes`:
- dynamic shapes (the default on TensorFlow and PyTorch): self-attention caches
  grow by one position a step, and a sentence that is done leaves the batch,
  so a step costs what its live hypotheses need;
- static shapes (the default on JAX, whose `jit` needs them): caches are
  fixed-size buffers as long as the longest output, and finished rows ride
  along, masked, until the whole batch is done.
Both give the same results (tested).

With `use_cache=False` every step recomputes the whole prefix instead
(`RecomputedSteps`), the slow reference the cached decoders are checked and
measured against.

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


class CachedSteps:
    """The model's own incremental decoding: key/value caches, one position a step."""

    def __init__(self, model):
        self.model = model

    def start(self, source_ids, max_length):
        return self.model.start_decoding(source_ids, max_length)

    def step(self, token_ids, state, index):
        return self.model.decoding_step(token_ids, state, index)


class RecomputedSteps:
    """The reference decoder: runs the whole prefix through the model every step.

    Its state is the encoder output and the prefix decoded so far, a growing
    `(R, t)` tensor, or with `index` a fixed `(R, max_length)` buffer of which
    the decoder runs every position and the step reads one.
    """

    def __init__(self, model):
        self.model = model

    def start(self, source_ids, max_length):
        encoder_outputs, padding_mask = self.model.encode(source_ids)
        rows = ops.shape(source_ids)[0]
        prefix = ops.full((rows, max_length), self.model.pad_id, dtype="int32")
        return {
            "source": {"encoder_outputs": encoder_outputs, "padding_mask": padding_mask},
            "target": {"prefix": prefix},
        }

    def step(self, token_ids, state, index):
        source, prefix = state["source"], state["target"]["prefix"]
        if index is None:
            prefix = ops.concatenate([prefix, token_ids[:, None]], axis=1)  # (R, t + 1)
            position = ops.shape(prefix)[1] - 1
        else:
            prefix = _write_column(prefix, index, token_ids)  # (R, max_length)
            position = index
        logits = self.model.decode(prefix, source["encoder_outputs"], source["padding_mask"])
        logits = ops.take(logits, position, axis=1)  # (R, V)
        log_probs = ops.log_softmax(logits, axis=-1)
        return log_probs, {"source": source, "target": {"prefix": prefix}}


def _take(tree, rows):
    """Rows `(R',)` of every tensor in a nested structure."""
    return keras.tree.map_structure(lambda tensor: ops.take(tensor, rows, axis=0), tree)


def _traced_zero(source_ids):
    """An int32 zero computed from the values of `source_ids`.

    Sizes offset by it are unknown while tracing, whatever the shapes: TensorFlow's
    `while_loop` keeps each loop variable's traced shape, so rows and caches
    sized from it may grow and shrink from step to step.
    """
    corner = source_ids[:1, :1]
    return ops.sum(ops.cast(ops.not_equal(corner, corner), "int32"))


def _write_column(tokens, index, ids):
    """Sets `tokens[..., index] = ids`. `where`, not `ops.slice_update`, which
    TensorFlow lowers to XlaDynamicUpdateSlice, an op TF Serving runs only
    with XLA compilation enabled."""
    column = ops.arange(ops.shape(tokens)[-1]) == index  # (T,)
    return ops.where(column, ops.expand_dims(ids, -1), tokens)


def _ban_special_tokens(model, log_probs):
    """`(R, V)` log-probabilities with `pad_id` and `bos_id` made impossible."""
    ids = ops.arange(ops.shape(log_probs)[-1])
    banned = ops.equal(ids, model.pad_id) | ops.equal(ids, model.bos_id)  # (V,)
    return ops.where(banned, _IMPOSSIBLE, log_probs)


def _prepare(model, source_ids, max_length, extra_length, use_cache, static_shapes):
    """Limits, buffer width, stepper, initial state and live rows of a search.

    Returns `(limits, width, steps, state, sentences, static)`: int `(B,)`
    per-sentence limits; the output width `T`, as wide as the longest possible
    output (`S + extra_length` for a padded width `S`, static wherever `S` is);
    the stepper; its state for the `B` sentences; int `(B,)` sentence ids of
    the rows; and whether shapes stay static.
    """
    on_jax = keras.backend.backend() == "jax"
    if on_jax and static_shapes is False:
        raise ValueError(
            "static_shapes=False needs a backend with dynamic shapes (TensorFlow, PyTorch): "
            "JAX's while_loop keeps every shape fixed. Received: static_shapes=False"
        )
    static = on_jax if static_shapes is None else static_shapes
    batch_size = ops.shape(source_ids)[0]
    if max_length is not None:
        limits = ops.full((batch_size,), max_length, dtype="int32")
        width = max_length
    else:
        lengths = ops.sum(ops.cast(model.padding_mask(source_ids), "int32"), axis=1)  # (B,)
        limits, width = lengths + extra_length, ops.shape(source_ids)[1] + extra_length
    steps = CachedSteps(model) if use_cache else RecomputedSteps(model)
    if static:
        state = steps.start(source_ids, width)
        sentences = ops.arange(batch_size, dtype="int32")
    else:  # caches that grow, batches that shrink
        zero = _traced_zero(source_ids)
        state = steps.start(source_ids, zero)
        sentences = ops.arange(batch_size + zero, dtype="int32")
    return limits, width, steps, state, sentences, static


def greedy_search(
    model,
    source_ids,
    max_length=None,
    extra_length=50,
    alpha=0.0,
    use_cache=True,
    return_scores=False,
    static_shapes=None,
):
    """Decodes by taking the most probable token at every step.

    Args:
        model: a built `Transformer`, or any object with its `start_decoding`,
            `decoding_step` (and, for `use_cache=False`, `encode`, `decode`),
            `padding_mask`, `pad_id`, `bos_id` and `eos_id`.
        source_ids: int `(B, S)` source ids, padded with `model.pad_id`.
        max_length: int or None, the most target tokens for every sentence.
            Defaults to each sentence's source length plus `extra_length`.
        extra_length: int, see `max_length` (50 in section 6.1).
        alpha: float, length penalty exponent used for the returned scores
            only (greedy choices do not depend on it).
        use_cache: bool, read earlier steps from the key/value cache instead
            of recomputing the prefix.
        return_scores: bool, also return the scores.
        static_shapes: bool or None, see the module docstring; None chooses
            static shapes on JAX only.

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
    limits, width, steps, state, rows, static = _prepare(
        model, source_ids, max_length, extra_length, use_cache, static_shapes
    )
    if not static:
        state = _take(state, rows)  # rows of a traced size, so they may leave
    tokens = ops.full((batch_size, width), model.pad_id, dtype="int32")  # (B, T)
    totals = ops.zeros((batch_size,), dtype="float32")  # (B,) log-probabilities
    lengths = ops.zeros((batch_size,), dtype="int32")  # (B,)

    def write(buffer, rows, values):
        return ops.scatter_update(buffer, rows[:, None], values)

    def condition(index, rows, ids, live, *_):
        return ops.logical_and(index < width, ops.any(live))

    def body(index, rows, ids, live, state, tokens, totals, lengths):
        # `rows` (R,) are the sentences of the rows still decoding; under
        # static shapes they are all sentences and `live` marks the unfinished.
        log_probs, state = steps.step(ids, state, index if static else None)  # (R, V)
        log_probs = _ban_special_tokens(model, log_probs)
        next_ids = ops.where(live, ops.cast(ops.argmax(log_probs, axis=-1), "int32"), model.pad_id)
        row_totals = ops.take(totals, rows) + ops.where(live, ops.max(log_probs, axis=-1), 0.0)
        row_lengths = ops.take(lengths, rows) + ops.cast(live, "int32")
        position = ops.full_like(rows, index)
        tokens = ops.scatter_update(tokens, ops.stack([rows, position], axis=1), next_ids)
        totals, lengths = write(totals, rows, row_totals), write(lengths, rows, row_lengths)
        ended = ops.equal(next_ids, model.eos_id) | (index + 1 >= ops.take(limits, rows))
        live = live & ops.logical_not(ended)
        if not static:
            rows, next_ids, live, state = _drop_finished(live, (rows, next_ids, live, state))
        return index + 1, rows, next_ids, live, state, tokens, totals, lengths

    ids = ops.full_like(rows, model.bos_id)
    live = ops.ones_like(rows, dtype="bool")
    loop_vars = (ops.convert_to_tensor(0, "int32"), rows, ids, live, state)
    outputs = ops.while_loop(condition, body, loop_vars + (tokens, totals, lengths))
    tokens, totals, lengths = outputs[-3:]
    if not return_scores:
        return tokens
    return tokens, totals / length_penalty(lengths, alpha)


def _drop_finished(live, tree):
    """Keeps the rows of `tree` where `live` `(R,)` is True, if any row ended."""

    def drop():
        return _take(tree, ops.nonzero(live)[0])

    return ops.cond(ops.all(live), lambda: tree, drop)


def _take_rows(values, indices):
    """Gathers `(B, C, ...)` values by `(B, N)` indices along axis 1."""
    extra_axes = len(values.shape) - 2
    indices = ops.reshape(indices, tuple(ops.shape(indices)) + (1,) * extra_axes)
    return ops.take_along_axis(values, indices, axis=1)


def _top_k(values, k, block_size=64):
    """`ops.top_k` of `(R, V)` values over blocks of the last axis, for large `V`.

    The `k` largest values of a row lie in the `k` blocks with the largest
    maxima, so after one maximum per block a top-k runs over those blocks
    alone: TensorFlow's top-k over a whole row of a vocabulary costs several
    times more than this. Ties may be broken differently.

    Returns:
        `(values, indices)`, `(R, k)` each, largest first.
    """
    rows, size = ops.shape(values)
    blocks = (
        -(-size // block_size) if isinstance(size, int) else (size + block_size - 1) // block_size
    )
    padding = blocks * block_size - size
    if not isinstance(padding, int) or padding:
        values = ops.pad(values, [[0, 0], [0, padding]], constant_values=2 * _IMPOSSIBLE)
    values = ops.reshape(values, (-1, blocks, block_size))  # (R, blocks, block)
    block_count = (
        min(k, blocks) if isinstance(k, int) and isinstance(blocks, int) else ops.minimum(k, blocks)
    )
    _, chosen = ops.top_k(ops.max(values, axis=-1), block_count)  # (R, k)
    candidates = ops.take_along_axis(values, chosen[..., None], axis=1)  # (R, k, block)
    top, picks = ops.top_k(ops.reshape(candidates, (rows, -1)), k)  # (R, k)
    block_of_pick = ops.take_along_axis(chosen, picks // block_size, axis=1)
    return top, block_of_pick * block_size + picks % block_size


def _expand(alive_log_probs, log_probs, beam_size):
    """The `2K` best one-token extensions of every sentence's `K` live hypotheses.

    Each row's own `2K` best tokens are taken first; the sentence's best `2K`
    extensions are among them, so the cumulative scores are added on `(n, K, 2K)`
    candidates instead of `(n, K, V)`.

    Args:
        alive_log_probs: float32 `(n, K)` cumulative log-probabilities.
        log_probs: float32 `(n * K, V)` next-token log-probabilities.
        beam_size: int `K`.

    Returns:
        `(scores, origins, ids)`: float32 `(n, 2K)` cumulative log-probabilities,
        best first; int `(n, 2K)` hypothesis each extends; int32 `(n, 2K)` token.
    """
    width, vocabulary = 2 * beam_size, ops.shape(log_probs)[-1]
    if isinstance(width, int) and isinstance(vocabulary, int):
        width = min(width, vocabulary)  # static, as JAX needs
    else:
        width = ops.minimum(width, vocabulary)
    row_log_probs, row_ids = _top_k(log_probs, width)  # (n * K, 2K)
    candidates = ops.reshape(row_log_probs, (-1, beam_size, width)) + alive_log_probs[..., None]
    scores, picks = ops.top_k(ops.reshape(candidates, (-1, beam_size * width)), 2 * beam_size)
    ids = ops.take_along_axis(ops.reshape(row_ids, (-1, beam_size * width)), picks, axis=1)
    return scores, picks // width, ops.cast(ids, "int32")


def _finish(finished, index, candidates, open_, alpha, beam_size):
    """Adds the candidates that end here to each sentence's `K` finished hypotheses.

    The best `K` candidates that end with EOS finish, and at the length limit
    every live one does.

    Args:
        finished: `(tokens, scores)`, int32 `(n, K, T)` and float32 `(n, K)`,
            best first.
        index: int scalar, the position just decoded.
        candidates: `(tokens, log_probs, ending)`: int32 `(n, 2K, T)`, float32
            `(n, 2K)` best first, bool `(n, 2K)` (ends with EOS or at the limit).
        open_: bool `(n, 1)`, False for sentences already done.
        alpha: float, length penalty exponent.
        beam_size: int `K`.

    Returns:
        The updated `(tokens, scores)`.
    """
    finished_tokens, finished_scores = finished
    tokens, log_probs, ending = candidates
    in_beam = (ops.arange(2 * beam_size) < beam_size)[None]  # (1, 2K)
    finishing = in_beam & ending & open_ & (log_probs > _IMPOSSIBLE / 2)
    new_scores = log_probs / length_penalty(index + 1, alpha)  # (n, 2K)
    pooled = ops.concatenate(
        [finished_scores, ops.where(finishing, new_scores, _IMPOSSIBLE)], axis=1
    )  # (n, 3K)
    finished_scores, keep = ops.top_k(pooled, beam_size)  # (n, K)
    finished_tokens = _take_rows(ops.concatenate([finished_tokens, tokens], axis=1), keep)
    return finished_tokens, finished_scores


def _keep_alive(candidates, beam_size):
    """The best `K` candidates that did not end: `(tokens, log_probs, ids)` and parents.

    Args:
        candidates: `(tokens, log_probs, ids, origins, ends)`: int32
            `(n, 2K, T)`, float32 `(n, 2K)`, int32 `(n, 2K)` token, int
            `(n, 2K)` hypothesis extended, bool `(n, 2K)`.
        beam_size: int `K`.

    Returns:
        `((tokens (n, K, T), log_probs (n, K), ids (n, K)), parents (n, K))`.
    """
    tokens, log_probs, ids, origins, ends = candidates
    log_probs, keep = ops.top_k(ops.where(ends, _IMPOSSIBLE, log_probs), beam_size)
    alive = (_take_rows(tokens, keep), log_probs, ops.take_along_axis(ids, keep, axis=1))
    return alive, ops.take_along_axis(origins, keep, axis=1)


def _settled(finished_scores, alive_log_probs, ends, index, alpha, num_hypotheses, early_stop):
    """Bool `(n,)`: sentences whose search can stop after this step.

    By default, once `K` hypotheses have finished and no live one scores better
    now than the worst of them (Hugging Face's default rule); stopping at `K`
    finished alone lets unlikely early endings, which enter the top `K` when the
    model is confident, end the search before its best hypothesis has finished.
    With `early_stop`, once the best extension of this step ended and
    `num_hypotheses` have finished (CTranslate2's rule).
    """
    if early_stop:
        count = ops.sum(ops.cast(finished_scores > _IMPOSSIBLE / 2, "int32"), axis=1)
        return ends[:, 0] & (count >= num_hypotheses)
    worst_finished = finished_scores[:, -1]  # scores are sorted, best first
    best_alive = alive_log_probs[:, 0] / length_penalty(index + 1, alpha)
    return (worst_finished > _IMPOSSIBLE / 2) & (worst_finished >= best_alive)


def beam_search(
    model,
    source_ids,
    beam_size=4,
    alpha=0.6,
    num_hypotheses=1,
    max_length=None,
    extra_length=50,
    use_cache=True,
    static_shapes=None,
    early_stop=False,
):
    """Beam search with the GNMT length penalty, returning the N best.

    At each step every live hypothesis is extended by every token and the
    `2 * beam_size` best extensions are kept: those among the best
    `beam_size` that end with `model.eos_id` join the sentence's finished
    hypotheses, and the best `beam_size` that do not stay alive. A sentence is
    done once it has `beam_size` finished hypotheses and no live one scores
    better at its current length than the worst of them (or, with
    `early_stop`, once its best extension ends), or once it reaches its
    length limit (its live hypotheses then finish as they are); the loop stops
    once every sentence is done. With `beam_size=1` this is exactly greedy
    search.

    Args:
        model: a built `Transformer` (or any object `greedy_search` takes).
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
        static_shapes: bool or None, see `greedy_search`.
        early_stop: bool, stop a sentence once its best extension ends and
            `num_hypotheses` have finished (CTranslate2's rule) instead of the
            default rule above.

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
    limits, width, steps, state, sentences, static = _prepare(
        model, source_ids, max_length, extra_length, use_cache, static_shapes
    )
    beams = ops.arange(beam_size)

    def rows_of(sentence_indices, hypotheses=beams[None]):
        """`(n,)` sentence indices and `(n or 1, K)` hypotheses of each -> `(n * K,)` rows."""
        return ops.reshape(sentence_indices[:, None] * beam_size + hypotheses, (-1,))

    def condition(index, sentences, alive, state, finished, done, outputs):
        return ops.logical_and(index < width, ops.logical_not(ops.all(done)))

    def body(index, sentences, alive, state, finished, done, outputs):
        # `sentences` (n,) are those still searched, `K` rows each; under static
        # shapes they are all sentences and `done` marks the finished ones.
        alive_tokens, alive_log_probs, alive_ids = alive
        log_probs, state = steps.step(
            ops.reshape(alive_ids, (-1,)), state, index if static else None
        )  # (n * K, V)
        log_probs = _ban_special_tokens(model, log_probs)
        top_log_probs, origins, new_ids = _expand(alive_log_probs, log_probs, beam_size)
        extended = _write_column(_take_rows(alive_tokens, origins), index, new_ids)  # (n, 2K, T)
        ends = ops.equal(new_ids, model.eos_id)  # (n, 2K)
        at_limit = (index + 1 >= ops.take(limits, sentences))[:, None]  # (n, 1)
        open_ = ops.logical_not(done)[:, None]
        finished = _finish(
            finished, index, (extended, top_log_probs, ends | at_limit), open_, alpha, beam_size
        )
        alive, parents = _keep_alive((extended, top_log_probs, new_ids, origins, ends), beam_size)
        settled = _settled(finished[1], alive[1], ends, index, alpha, num_hypotheses, early_stop)
        done = done | settled | at_limit[:, 0]
        outputs = tuple(
            ops.scatter_update(output, sentences[:, None], values[:, :num_hypotheses])
            for output, values in zip(outputs, finished, strict=True)
        )
        # Each live hypothesis continues its parent's self-attention cache.
        parent_rows = rows_of(ops.arange(ops.shape(parents)[0]), parents)  # (n * K,)
        state = {"source": state["source"], "target": _take(state["target"], parent_rows)}
        if not static:
            sentences, alive, finished, done, state = _drop_done(
                done, (sentences, alive, finished, done), state, rows_of
            )
        return index + 1, sentences, alive, state, finished, done, outputs

    def hypotheses(fill, dtype):
        return ops.full((ops.shape(sentences)[0], beam_size, width), fill, dtype=dtype)

    rows = ops.shape(sentences)[0]
    first = ops.where(beams == 0, 0.0, _IMPOSSIBLE)  # one live hypothesis at first
    alive = (
        hypotheses(model.pad_id, "int32"),
        ops.zeros((rows, 1)) + first[None],
        ops.full((rows, beam_size), model.bos_id, dtype="int32"),
    )
    finished = (hypotheses(model.pad_id, "int32"), ops.full((rows, beam_size), _IMPOSSIBLE))
    outputs = (
        ops.full((batch_size, num_hypotheses, width), model.pad_id, dtype="int32"),
        ops.full((batch_size, num_hypotheses), _IMPOSSIBLE),
    )
    state = _take(state, ops.repeat(sentences, beam_size))  # (n * K) rows
    done = ops.zeros_like(sentences, dtype="bool")
    loop_vars = (ops.convert_to_tensor(0, "int32"), sentences, alive, state, finished, done)
    return ops.while_loop(condition, body, loop_vars + (outputs,))[-1]


def _drop_done(done, per_sentence, state, rows_of):
    """Keeps the sentences that are not done, and the rows of their hypotheses.

    Returns `per_sentence` (a tuple of nested `(n, ...)` values) followed by
    `state`, both with the done sentences removed.
    """

    def drop():
        keep = ops.nonzero(ops.logical_not(done))[0]  # (n',)
        return (*_take(per_sentence, keep), _take(state, rows_of(keep)))

    return ops.cond(ops.any(done), drop, lambda: (*per_sentence, state))


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
