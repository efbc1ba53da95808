"""Beam search with a length penalty (section 6.1)."""

from keras import ops

from keras_transformer.decoding.controls import check_controls, limit_lengths
from keras_transformer.decoding.steps import (
    IMPOSSIBLE,
    check_prefix,
    gather_rows,
    guide,
    length_penalty,
    penalty_offset,
    prepare_search,
    write_column,
)


def _take_rows(values, indices):
    """Gathers `(B, C, ...)` values by `(B, N)` indices along axis 1.

    One gather of the flattened `(B * C, ...)` rows: `ops.take_along_axis`
    broadcasts its indices to the values' trailing axes and, on TensorFlow,
    transposes both, which costs several times more on a step's large tensors.
    """
    shape = ops.shape(values)
    rows = ops.arange(shape[0], dtype="int32")[:, None] * shape[1] + ops.cast(indices, "int32")
    flat = ops.reshape(values, (-1, *shape[2:]))  # (B * C, ...)
    picked = ops.take(flat, ops.reshape(rows, (-1,)), axis=0)  # (B * N, ...)
    return ops.reshape(picked, (shape[0], ops.shape(indices)[1], *shape[2:]))


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
        values = ops.pad(values, [[0, 0], [0, padding]], constant_values=2 * IMPOSSIBLE)
    values = ops.reshape(values, (-1, blocks, block_size))  # (R, blocks, block)
    block_count = (
        min(k, blocks) if isinstance(k, int) and isinstance(blocks, int) else ops.minimum(k, blocks)
    )
    _, chosen = ops.top_k(ops.max(values, axis=-1), block_count)  # (R, k)
    candidates = _take_rows(values, chosen)  # (R, k, block)
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


def _finish(finished, index, candidates, open_, penalty, beam_size):
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
        penalty: callable, a length's length penalty.
        beam_size: int `K`.

    Returns:
        The updated `(tokens, scores)`.
    """
    finished_tokens, finished_scores, *finished_extra = finished
    tokens, log_probs, ending, *extra = candidates
    in_beam = (ops.arange(2 * beam_size) < beam_size)[None]  # (1, 2K)
    finishing = in_beam & ending & open_ & (log_probs > IMPOSSIBLE / 2)
    new_scores = log_probs / penalty(index + 1)  # (n, 2K)
    pooled = ops.concatenate(
        [finished_scores, ops.where(finishing, new_scores, IMPOSSIBLE)], axis=1
    )  # (n, 3K)
    finished_scores, keep = ops.top_k(pooled, beam_size)  # (n, K)
    finished_tokens = _take_rows(ops.concatenate([finished_tokens, tokens], axis=1), keep)
    # Per-hypothesis histories beside the tokens (alignments) follow the same picks.
    extra = [
        _take_rows(ops.concatenate([old, new], axis=1), keep)
        for old, new in zip(finished_extra, extra, strict=True)
    ]
    return (finished_tokens, finished_scores, *extra)


def _candidates_alignments(step_attention, alignments, origins, index):
    """Each candidate's alignments: its parent's, with this step's written at `index`.

    Args:
        step_attention: float32 `(n * K, S)`, each live hypothesis's attention at
            this step.
        alignments: float32 `(n, K, T, S)`, the live hypotheses' alignments.
        origins: int `(n, 2K)`, the hypothesis each candidate extends.
        index: int scalar, the position just decoded.

    Returns:
        float32 `(n, 2K, T, S)`.
    """
    _, beam_size, width, sources = ops.shape(alignments)
    step = ops.reshape(step_attention, (-1, beam_size, 1, sources))  # (n, K, 1, S)
    column = (ops.arange(width) == index)[None, None, :, None]  # (1, 1, T, 1)
    return _take_rows(ops.where(column, step, alignments), origins)


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
    tokens, log_probs, ids, origins, ends, *extra = candidates
    log_probs, keep = ops.top_k(ops.where(ends, IMPOSSIBLE, log_probs), beam_size)
    alive = (_take_rows(tokens, keep), log_probs, ops.take_along_axis(ids, keep, axis=1))
    alive += tuple(_take_rows(history, keep) for history in extra)
    return alive, ops.take_along_axis(origins, keep, axis=1)


def _settled(finished_scores, alive_log_probs, ends, index, penalty, num_hypotheses, early_stop):
    """Bool `(n,)`: sentences whose search can stop after this step.

    By default, once `K` hypotheses have finished and no live one scores better
    now than the worst of them (Hugging Face's default rule); stopping at `K`
    finished alone lets unlikely early endings, which enter the top `K` when the
    model is confident, end the search before its best hypothesis has finished.
    With `early_stop`, once the best extension of this step ended and
    `num_hypotheses` have finished (CTranslate2's rule).
    """
    if early_stop:
        count = ops.sum(ops.cast(finished_scores > IMPOSSIBLE / 2, "int32"), axis=1)
        return ends[:, 0] & (count >= num_hypotheses)
    worst_finished = finished_scores[:, -1]  # scores are sorted, best first
    best_alive = alive_log_probs[:, 0] / penalty(index + 1)
    return (worst_finished > IMPOSSIBLE / 2) & (worst_finished >= best_alive)


def _check_sizes(beam_size, num_hypotheses):
    if isinstance(beam_size, int) and beam_size < 1:
        raise ValueError(f"beam_size must be positive. Received: beam_size={beam_size}")
    if isinstance(beam_size, int) and not 1 <= num_hypotheses <= beam_size:
        raise ValueError(
            "num_hypotheses must be between 1 and beam_size. Received: "
            f"num_hypotheses={num_hypotheses}, beam_size={beam_size}"
        )


def _initial_beams(model, sentences, batch_size, width, beam_size, num_hypotheses, sources):
    """The search's first values: `(alive, finished, outputs)`.

    `alive` is `(tokens (n, K, W), log-probs (n, K), last ids (n, K))` with one
    live hypothesis per sentence; `finished` `(tokens, scores)` holds none yet;
    `outputs` `(tokens (B, N, W), scores (B, N))` collects the results. With
    `sources` (the source width S, to collect alignments) each also holds
    float32 `(., ., W, S)` alignments last.
    """
    rows = ops.shape(sentences)[0]

    def hypotheses(fill, dtype):
        return ops.full((rows, beam_size, width), fill, dtype=dtype)

    first = ops.where(ops.arange(beam_size) == 0, 0.0, IMPOSSIBLE)
    alive = (
        hypotheses(model.pad_id, "int32"),
        ops.zeros((rows, 1)) + first[None],
        ops.full((rows, beam_size), model.bos_id, dtype="int32"),
    )
    finished = (hypotheses(model.pad_id, "int32"), ops.full((rows, beam_size), IMPOSSIBLE))
    outputs = (
        ops.full((batch_size, num_hypotheses, width), model.pad_id, dtype="int32"),
        ops.full((batch_size, num_hypotheses), IMPOSSIBLE),
    )
    if sources is not None:
        alive += (ops.zeros((rows, beam_size, width, sources)),)
        finished += (ops.zeros((rows, beam_size, width, sources)),)
        outputs += (ops.zeros((batch_size, num_hypotheses, width, sources)),)
    return alive, finished, outputs


def beam_search(
    model,
    source_ids,
    beam_size=4,
    alpha=0.6,
    num_hypotheses=1,
    max_output_length=None,
    extra_length=50,
    use_cache=True,
    static_shapes=None,
    early_stop=False,
    target_prefix=None,
    return_attention=False,
    constraint=None,
    controls=None,
    penalty_form="gnmt",
    end_at_limit=False,
):
    """Beam search with a length penalty, returning the N best.

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
        max_output_length: int or None, the most target tokens for every sentence.
            Defaults to each sentence's source length plus `extra_length`.
        extra_length: int, see `max_output_length`.
        use_cache: bool, read earlier steps from the key/value cache instead
            of recomputing the prefix.
        static_shapes: bool or None, see `greedy_search`.
        early_stop: bool, stop a sentence once its best extension ends and
            `num_hypotheses` have finished (CTranslate2's rule) instead of the
            default rule above.
        target_prefix: int `(B, P)` or None: every hypothesis starts with its
            sentence's tokens (padded with `model.pad_id`), scored as forced
            tokens, and the search continues from the cache they filled.
        return_attention: bool, also return each hypothesis's alignments (as
            `greedy_search` returns them).
        constraint: callable or None, restricts each hypothesis's next
            token (see `greedy_search`).
        controls: `DecodingControls`, a dict of its fields, or None: each
            hypothesis's own output checked (see `greedy_search`); the scores are
            log-probabilities of the cut distribution.
        penalty_form: "gnmt" (the paper's) or "power" (`transformers`'), the
            length penalty's form (`length_penalty`).
        end_at_limit: bool, a hypothesis's last allowed token is the end
            token, scored 0 (`transformers`' `forced_eos_token_id`).

    Returns:
        `(tokens, scores)`: int32 `(B, N, T)` hypotheses (`T` as in
        `greedy_search`), best first, each ending with `model.eos_id` (when
        produced) then `model.pad_id`; and
        float32 `(B, N)` log-probabilities divided by `length_penalty`; with
        `return_attention`, float32 `(B, N, T, S)` alignments third.

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
    _check_sizes(beam_size, num_hypotheses)
    controls = check_controls(controls)
    options = (max_output_length, extra_length, use_cache, static_shapes, return_attention)
    penalty_offset(penalty_form)  # checks it
    search = {"prefix": check_prefix(target_prefix), "constraint": constraint}
    search.update(controls=controls, end_at_limit=end_at_limit)

    def penalty(length):
        return length_penalty(length, alpha, penalty_form)

    arguments = (beam_size, penalty, num_hypotheses, early_stop, options, search)
    return _search(model, source_ids, *arguments)


def _search(model, source_ids, beam_size, penalty, num_hypotheses, early_stop, options, search):
    """`beam_search` once its settings are checked.

    Args:
        penalty: callable, a length's length penalty.
        options: `(max_output_length, extra_length, use_cache, static_shapes,
            return_attention)`.
        search: dict with `prefix`, `constraint` and `controls`, completed
            here into what `guide` reads.
    """
    return_attention, controls = options[-1], search["controls"]
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    batch_size = ops.shape(source_ids)[0]
    limits, width, steps, state, sentences, static = prepare_search(model, source_ids, *options)
    limits = limit_lengths(limits, controls)
    search = {**search, "source_ids": source_ids, "limits": limits}

    def condition(index, sentences, alive, state, finished, done, outputs):
        return ops.logical_and(index < width, ops.logical_not(ops.all(done)))

    def body(index, sentences, alive, state, finished, done, outputs):
        # `sentences` (n,) are those still searched, `K` rows each; under static
        # shapes they are all sentences and `done` marks the finished ones.
        alive_tokens, alive_log_probs, alive_ids, *alive_alignments = alive
        log_probs, state = steps.step(
            ops.reshape(alive_ids, (-1,)), state, index if static else None,
            normalize=controls is None,
        )  # fmt: skip  # (n * K, V)
        row_sentences = ops.repeat(sentences, beam_size)  # (n * K,)
        history = ops.reshape(alive_tokens, (-1, width))  # (n * K, T)
        log_probs = guide(model, log_probs, index, row_sentences, history, search)
        top_log_probs, origins, new_ids = _expand(alive_log_probs, log_probs, beam_size)
        extended = write_column(_take_rows(alive_tokens, origins), index, new_ids)  # (n, 2K, T)
        histories = ()
        if return_attention:
            step_attention = state["target"]["attention"]  # (n * K, S)
            histories = (
                _candidates_alignments(step_attention, alive_alignments[0], origins, index),
            )
        ends = ops.equal(new_ids, model.eos_id)  # (n, 2K)
        at_limit = (index + 1 >= ops.take(limits, sentences))[:, None]  # (n, 1)
        open_ = ops.logical_not(done)[:, None]
        candidates = (extended, top_log_probs, ends | at_limit, *histories)
        finished = _finish(finished, index, candidates, open_, penalty, beam_size)
        alive, parents = _keep_alive(
            (extended, top_log_probs, new_ids, origins, ends, *histories), beam_size
        )
        settled = _settled(finished[1], alive[1], ends, index, penalty, num_hypotheses, early_stop)
        done = done | settled | at_limit[:, 0]
        outputs = tuple(
            ops.scatter_update(output, sentences[:, None], values[:, :num_hypotheses])
            for output, values in zip(outputs, finished, strict=True)
        )
        # Each live hypothesis continues its parent's self-attention cache.
        parent_rows = _rows_of(ops.arange(ops.shape(parents)[0]), beam_size, parents)  # (n * K,)
        state = {"source": state["source"], "target": gather_rows(state["target"], parent_rows)}
        if not static:
            sentences, alive, finished, done, state = _drop_done(
                done, (sentences, alive, finished, done), state, beam_size
            )
        return index + 1, sentences, alive, state, finished, done, outputs

    sources = ops.shape(source_ids)[1] if return_attention else None
    alive, finished, outputs = _initial_beams(
        model, sentences, batch_size, width, beam_size, num_hypotheses, sources
    )
    state = gather_rows(state, ops.repeat(sentences, beam_size))  # (n * K) rows
    done = ops.zeros_like(sentences, dtype="bool")
    loop_vars = (ops.convert_to_tensor(0, "int32"), sentences, alive, state, finished, done)
    return ops.while_loop(condition, body, loop_vars + (outputs,))[-1]


def _rows_of(sentence_indices, beam_size, hypotheses=None):
    """`(n,)` sentence indices and `(n or 1, K)` hypotheses of each (all `K` by
    default) -> `(n * K,)` rows of the hypotheses."""
    if hypotheses is None:
        hypotheses = ops.arange(beam_size)[None]
    return ops.reshape(sentence_indices[:, None] * beam_size + hypotheses, (-1,))


def _drop_done(done, per_sentence, state, beam_size):
    """Keeps the sentences that are not done, and the rows of their hypotheses.

    Returns `per_sentence` (a tuple of nested `(n, ...)` values) followed by
    `state`, both with the done sentences removed.
    """

    def drop():
        keep = ops.nonzero(ops.logical_not(done))[0]  # (n',)
        return (*gather_rows(per_sentence, keep), gather_rows(state, _rows_of(keep, beam_size)))

    return ops.cond(ops.any(done), drop, lambda: (*per_sentence, state))
