"""Greedy search, and the row-by-row loop it shares with sampling."""

import keras
from keras import ops

from keras_transformer.decoding.controls import check_controls, limit_lengths
from keras_transformer.decoding.steps import (
    check_prefix,
    gather_rows,
    guide,
    length_penalty,
    penalty_offset,
    prepare_search,
)


def greedy_search(
    model,
    source_ids,
    max_output_length=None,
    extra_length=50,
    alpha=0.0,
    use_cache=True,
    return_scores=False,
    static_shapes=None,
    target_prefix=None,
    return_attention=False,
    constraint=None,
    controls=None,
    penalty_form="gnmt",
    end_at_limit=False,
):
    """Decodes by taking the most probable token at every step.

    Args:
        model: a built `Transformer`, or any object with its `start_decoding`,
            `decoding_step` (and, for `use_cache=False`, `encode`, `decode`),
            `padding_mask`, `pad_id`, `bos_id` and `eos_id`.
        source_ids: int `(B, S)` source ids, padded with `model.pad_id`.
        max_output_length: int or None, the most target tokens for every sentence.
            Defaults to each sentence's source length plus `extra_length`.
        extra_length: int, see `max_output_length` (50 in section 6.1).
        alpha: float, length penalty exponent used for the returned scores
            only (greedy choices do not depend on it).
        use_cache: bool, read earlier steps from the key/value cache instead
            of recomputing the prefix.
        return_scores: bool, also return the scores.
        static_shapes: bool or None, see the module docstring; None chooses
            static shapes on JAX only.
        target_prefix: int `(B, P)` or None: each output starts with its row's
            tokens (padded with `model.pad_id`), scored as forced tokens, and
            the search continues from the cache they filled.
        return_attention: bool, also return alignments: for each output
            token, the last decoder layer's attention over the source,
            averaged over heads (CTranslate2's `return_attention`).
        constraint: callable or None, `(log_probs (R, V), history (R, T),
            index, source_ids (R, S), limits (R,)) -> log_probs (R, V)` with
            the tokens a row may not produce next made impossible (such as a
            `BracketConstraint`).
        controls: `DecodingControls`, a dict of its fields, or None:
            repetition, length and banned-token controls. They cut the
            logits before the softmax, so the choices and the returned scores
            follow the cut distribution (as CTranslate2's do); each may be a
            tensor with one value a sentence. See
            `keras_transformer.decoding.controls`.
        penalty_form: "gnmt" or "power", the length penalty's form
            (`length_penalty`).
        end_at_limit: bool, a row's last allowed token is the end token,
            scored 0 (`transformers`' `forced_eos_token_id`).

    Returns:
        int32 `(B, T)` token ids, `T = max_output_length` or `S + extra_length`:
        each row ends with `model.eos_id` (when produced) followed by
        `model.pad_id`. With `return_scores`, also
        float32 `(B,)` log-probabilities divided by `length_penalty`; with
        `return_attention`, last, float32 `(B, T, S)` alignments (rows of
        padding positions are 0; each other row sums to 1 over the source).

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

    def most_probable(log_probs, index, rows):
        if keras.backend.backend() == "tensorflow":
            # One top-1 gives the token and its log-probability, the first of
            # equal ones as argmax: TensorFlow's argmax of floats runs five
            # more ops over the vocabulary, and the max another. (PyTorch's
            # top-k may break ties otherwise, so argmax stays elsewhere.)
            values, ids = ops.top_k(log_probs, 1)  # (R, 1) each
            return ops.cast(ids[:, 0], "int32"), values[:, 0]
        return ops.cast(ops.argmax(log_probs, axis=-1), "int32"), ops.max(log_probs, axis=-1)

    controls = check_controls(controls)
    penalty_offset(penalty_form)  # checks it, scores asked for or not
    options = (max_output_length, extra_length, use_cache, static_shapes, target_prefix)
    tokens, totals, lengths, attention = search_rows(
        model, source_ids, most_probable, *options, return_attention, constraint, controls,
        end_at_limit,
    )  # fmt: skip
    results = (tokens,)
    if return_scores:
        results += (totals / length_penalty(lengths, alpha, penalty_form),)
    if return_attention:
        results += (attention,)
    return results[0] if len(results) == 1 else results


def search_rows(
    model,
    source_ids,
    choose,
    max_output_length,
    extra_length,
    use_cache,
    static_shapes,
    prefix,
    return_attention=False,
    constraint=None,
    controls=None,
    end_at_limit=False,
):
    """One token a row a step, as `choose` picks it: the loop greedy search and sampling share.

    Args:
        model, source_ids, max_output_length, extra_length, use_cache,
        static_shapes: as in `greedy_search`.
        choose: callable `(log_probs (R, V), index, rows (R,)) -> (ids (R,),
            log_probs of those ids (R,))`.
        prefix: int `(B, P)` target prefix or None (`greedy_search`'s
            `target_prefix`).
        return_attention: bool, collect each token's alignment.
        constraint: callable or None, as `greedy_search` takes it.
        controls: dict or None, from `check_controls`.
        end_at_limit: bool, as `greedy_search` takes it.

    Returns:
        `(tokens, totals, lengths, attention)`: int32 `(B, T)`, float32 `(B,)`
        summed log-probabilities, int32 `(B,)` tokens produced, and float32
        `(B, T, S)` alignments (None without `return_attention`).
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    prefix = check_prefix(prefix)
    batch_size = ops.shape(source_ids)[0]
    limits, width, steps, state, rows, static = prepare_search(
        model, source_ids, max_output_length, extra_length, use_cache, static_shapes,
        return_attention,
    )  # fmt: skip
    limits = limit_lengths(limits, controls)
    if not static:
        state = gather_rows(state, rows)  # rows of a traced size, so they may leave
    search = {"prefix": prefix, "constraint": constraint, "source_ids": source_ids}
    search.update(limits=limits, controls=controls, end_at_limit=end_at_limit)
    read_history = constraint is not None or controls is not None
    tokens = ops.full((batch_size, width), model.pad_id, dtype="int32")  # (B, T)
    totals = ops.zeros((batch_size,), dtype="float32")  # (B,) log-probabilities
    lengths = ops.zeros((batch_size,), dtype="int32")  # (B,)
    # (B, T, S) alignments; a dummy (B, 1, 1) carried when none are asked for.
    attention_shape = (width, ops.shape(source_ids)[1]) if return_attention else (1, 1)
    attention = ops.zeros((batch_size, *attention_shape), dtype="float32")

    def write(buffer, rows, values):
        return ops.scatter_update(buffer, rows[:, None], values)

    def condition(index, rows, ids, live, *_):
        return ops.logical_and(index < width, ops.any(live))

    def body(index, rows, ids, live, state, tokens, totals, lengths, attention):
        # `rows` (R,) are the sentences of the rows in the batch (under static
        # shapes, all of them); `live` marks those not finished.
        log_probs, state = steps.step(
            ids, state, index if static else None, normalize=controls is None
        )  # (R, V)
        history = ops.take(tokens, rows, axis=0) if read_history else None  # (R, T)
        log_probs = guide(model, log_probs, index, rows, history, search)
        chosen, chosen_log_probs = choose(log_probs, index, rows)
        next_ids = ops.where(live, chosen, model.pad_id)
        row_totals = ops.take(totals, rows) + ops.where(live, chosen_log_probs, 0.0)
        row_lengths = ops.take(lengths, rows) + ops.cast(live, "int32")
        position = ops.full_like(rows, index)
        cells = ops.stack([rows, position], axis=1)  # (R, 2)
        tokens = ops.scatter_update(tokens, cells, next_ids)
        if return_attention:
            alignment = ops.where(live[:, None], state["target"]["attention"], 0.0)  # (R, S)
            attention = ops.scatter_update(attention, cells, alignment)
        totals, lengths = write(totals, rows, row_totals), write(lengths, rows, row_lengths)
        ended = ops.equal(next_ids, model.eos_id) | (index + 1 >= ops.take(limits, rows))
        live = live & ops.logical_not(ended)
        if not static:
            rows, next_ids, live, state = _drop_finished(live, (rows, next_ids, live, state))
        return index + 1, rows, next_ids, live, state, tokens, totals, lengths, attention

    ids = ops.full_like(rows, model.bos_id)
    live = ops.ones_like(rows, dtype="bool")
    loop_vars = (ops.convert_to_tensor(0, "int32"), rows, ids, live, state)
    outputs = ops.while_loop(condition, body, loop_vars + (tokens, totals, lengths, attention))
    tokens, totals, lengths, attention = outputs[-4:]
    return tokens, totals, lengths, attention if return_attention else None


# Finished rows are dropped once they are this share of the batch: each drop
# gathers the whole decoder state (about a tenth of a step's time), and a
# finished row kept a few steps costs only its share of them.
DROP_SHARE = 1 / 16


def _drop_finished(live, tree):
    """Keeps the rows of `tree` where `live` `(R,)` is True, once `DROP_SHARE` of them ended."""

    def drop():
        return gather_rows(tree, ops.nonzero(live)[0])

    finished = ops.sum(ops.cast(ops.logical_not(live), "float32"))
    rows = ops.cast(ops.shape(live)[0], "float32")
    return ops.cond(finished >= DROP_SHARE * rows, drop, lambda: tree)
