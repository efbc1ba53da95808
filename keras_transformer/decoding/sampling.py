"""Ancestral sampling with temperature, top-k and top-p (nucleus) filtering."""

import numbers

import keras
from keras import ops

from keras_transformer.decoding.controls import check_controls
from keras_transformer.decoding.greedy import search_rows
from keras_transformer.decoding.steps import IMPOSSIBLE, check_prefix


def _is_number(value):
    return isinstance(value, numbers.Real)


def _check(num_samples, temperature, top_k, top_p):
    """Refuses bad Python-number settings; tensors are the caller's to check."""
    if num_samples < 1:
        raise ValueError(f"num_samples must be positive. Received: num_samples={num_samples}")
    if _is_number(temperature) and not temperature > 0:
        raise ValueError(f"temperature must be positive. Received: temperature={temperature}")
    if _is_number(top_k) and top_k < 0:
        raise ValueError(f"top_k must be 0 (off) or positive. Received: top_k={top_k}")
    if _is_number(top_p) and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1]. Received: top_p={top_p}")


def filter_log_probs(log_probs, temperature=1.0, top_k=0, top_p=1.0):
    """The sampling distribution's log-weights: tempered, then cut to the top k and the nucleus.

    Each setting is a Python number, applied to every row, or a tensor `(R,)`
    with one value a row (the SavedModel's per-sentence settings).

    Args:
        log_probs: float32 `(R, V)` log-probabilities.
        temperature: float > 0, or float `(R,)`; below 1 sharpens, above 1 flattens.
        top_k: int, or int `(R,)`: keep the k most probable tokens (0: all).
        top_p: float in (0, 1], or float `(R,)`: keep the smallest set of most
            probable tokens whose probability reaches `top_p` (Holtzman et
            al., 2020).

    Returns:
        float32 `(R, V)` unnormalized log-weights; tokens filtered out are
        `IMPOSSIBLE`.
    """
    if not all(_is_number(value) for value in (temperature, top_k, top_p)):
        return _filter_rows(log_probs, temperature, top_k, top_p)
    logits = ops.convert_to_tensor(log_probs, "float32")
    if temperature != 1.0:  # a pass over (R, V) saved each step when it is 1
        logits = logits / temperature
    if top_k:
        k = min(top_k, logits.shape[-1]) if isinstance(logits.shape[-1], int) else top_k
        kth = ops.top_k(logits, k)[0][:, -1:]  # (R, 1)
        logits = ops.where(logits >= kth, logits, IMPOSSIBLE)
    if top_p < 1.0:
        probs = ops.softmax(logits, axis=-1)
        sorted_probs, order = ops.top_k(probs, ops.shape(probs)[-1])  # (R, V), descending
        before = ops.cumsum(sorted_probs, axis=-1) - sorted_probs  # mass of the better tokens
        keep_sorted = before < top_p  # the first token is always kept
        keep = ops.take_along_axis(keep_sorted, ops.argsort(order, axis=-1), axis=-1)
        logits = ops.where(keep, logits, IMPOSSIBLE)
    return logits


# Rows whose top-k cut keeps at most this many tokens are filtered from a
# partial sort of this width instead of a sort of the whole vocabulary.
PARTIAL_SORT_WIDTH = 64


def _filter_rows(log_probs, temperature, top_k, top_p):
    """`filter_log_probs` with settings that are tensors: one value a row, known at run time.

    The same cuts as the Python-number path (the nucleus is taken after the
    top-k cut), made on the tokens in sorted order: a partial sort of
    `PARTIAL_SORT_WIDTH` when every row that cuts has a top-k that small (a
    nucleus inside the top k needs no more), else the whole vocabulary, and
    none at run time when no row cuts. Tokens tied with the last one kept
    are kept.
    """
    logits = ops.convert_to_tensor(log_probs, "float32")
    rows, vocabulary = ops.shape(logits)[0], ops.shape(logits)[-1]

    def per_row(value, dtype):
        return ops.broadcast_to(ops.convert_to_tensor(value, dtype), (rows,))

    temperature, top_k, top_p = (
        per_row(temperature, "float32"), per_row(top_k, "int32"), per_row(top_p, "float32")
    )  # fmt: skip
    logits = logits / temperature[:, None]
    cuts = (top_k > 0) | (top_p < 1.0)  # (R,)

    def cut(width):
        sorted_logits = ops.top_k(logits, width)[0]  # (R, W), descending
        kth = ops.take_along_axis(sorted_logits, (ops.clip(top_k, 1, width) - 1)[:, None], axis=-1)
        in_top_k = (top_k[:, None] <= 0) | (sorted_logits >= kth)
        sorted_probs = ops.softmax(ops.where(in_top_k, sorted_logits, IMPOSSIBLE), axis=-1)
        before = ops.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep = in_top_k & (before < top_p[:, None])  # the first token is always kept
        # The smallest value kept; rows that do not cut keep everything.
        threshold = ops.min(ops.where(keep, sorted_logits, float("inf")), axis=-1)
        threshold = ops.where(cuts, threshold, float("-inf"))
        return ops.where(logits >= threshold[:, None], logits, IMPOSSIBLE)

    def filtered():
        if not isinstance(vocabulary, int) or vocabulary <= PARTIAL_SORT_WIDTH:
            return cut(vocabulary)
        small = ops.all(~cuts | ((top_k > 0) & (top_k <= PARTIAL_SORT_WIDTH)))
        return ops.cond(small, lambda: cut(PARTIAL_SORT_WIDTH), lambda: cut(vocabulary))

    return ops.cond(ops.any(cuts), filtered, lambda: logits)


def _inverse_cdf(logits, uniform):
    """Token ids `(R,)` drawn from `softmax(logits)` `(R, V)` by uniforms `(R,)` in [0, 1).

    The cumulative weights are left unnormalized (the threshold is scaled to
    their total instead), which saves softmax's sum and division: this runs
    over the whole vocabulary every step.
    """
    weights = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
    cdf = ops.cumsum(weights, axis=-1)  # (R, V)
    threshold = ops.expand_dims(uniform * cdf[:, -1], 1)
    ids = ops.sum(ops.cast(cdf <= threshold, "int32"), axis=-1)
    return ops.minimum(ids, ops.shape(logits)[-1] - 1)


def sample(
    model,
    source_ids,
    num_samples=1,
    temperature=1.0,
    top_k=0,
    top_p=1.0,
    seed=None,
    max_output_length=None,
    extra_length=50,
    use_cache=True,
    static_shapes=None,
    target_prefix=None,
    return_attention=False,
    uniforms=None,
    controls=None,
):
    """Draws translations token by token from the model's distribution.

    Each step draws the next token from the model's next-token distribution,
    tempered and filtered (`filter_log_probs`), with the cache and the
    finished-row handling of `greedy_search`. The uniform numbers behind the
    draws are generated before the loop from `seed`, one a row a step, so a
    seed gives the same samples with or without the cache, and under static
    or dynamic shapes. The common use is back-translation (Edunov et al.,
    2018): samples of a target->source model make better synthetic sources
    than beam search.

    Args:
        model: a built `Transformer` (or any object `greedy_search` takes).
        source_ids: int `(B, S)` source ids, padded with `model.pad_id`.
        num_samples: int `N`, samples drawn per sentence.
        temperature: float > 0, divides the log-probabilities.
        top_k: int, sample among the k most probable tokens (0: all); 1 is
            greedy search.
        top_p: float in (0, 1], sample within the nucleus of this mass.
            `temperature`, `top_k` and `top_p` may also be tensors `(B,)`,
            one value a sentence; those are not checked here.
        seed: int or None; None draws from Keras's global generator.
        max_output_length, extra_length, use_cache, static_shapes,
            target_prefix, return_attention: as in `greedy_search` (the
            prefix is `(B, P)`, shared by a sentence's samples).
        uniforms: float `(B, N, T)` numbers in [0, 1), the draws' randomness
            in place of `seed`, `T` at least the output width: for callers
            with randomness of their own (the SavedModel draws each
            sentence's from that sentence's seed, so its samples do not
            depend on the request it came in).
        controls: `DecodingControls`, a dict of its fields, or None: each
            sample's own output checked (see `greedy_search`); they cut the logits before
            temperature and filtering, and the returned log-probabilities
            are those of the cut distribution.

    Returns:
        `(tokens, log_probs)`: int32 `(B, N, T)` samples, each ending with
        `model.eos_id` (when produced) then `model.pad_id`; float32 `(B, N)`
        their log-probabilities under the model (untempered, unfiltered, no
        length penalty); with `return_attention`, float32 `(B, N, T, S)`
        alignments third.

    Example:
    >>> model = Transformer.from_preset("transformer_small", vocabulary_size=20)
    >>> model.build(((None, None), (None, None)))
    >>> tokens, log_probs = sample(
    ...     model, keras.ops.array([[5, 6, 3]]), num_samples=2, top_k=5, seed=1)
    >>> tuple(tokens.shape), tuple(log_probs.shape)
    ((1, 2, 53), (1, 2))

    References:
        Edunov et al., 2018, "Understanding Back-Translation at Scale";
        Holtzman et al., 2020, "The Curious Case of Neural Text Degeneration".
    """
    _check(num_samples, temperature, top_k, top_p)
    controls = check_controls(controls)
    if controls:  # a sentence's settings for each of its samples' rows
        controls = {
            name: value
            if _is_number(value) or (name == "banned_tokens" and len(value.shape) == 2)
            else ops.repeat(value, num_samples, axis=0)
            for name, value in controls.items()
        }
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    batch_size = ops.shape(source_ids)[0]
    rows = ops.repeat(source_ids, num_samples, axis=0)  # (B * N, S), a sentence's samples adjacent
    prefix = check_prefix(target_prefix)
    if prefix is not None:
        prefix = ops.repeat(prefix, num_samples, axis=0)
    settings = [
        value if _is_number(value) else ops.repeat(value, num_samples, axis=0)  # (B * N,)
        for value in (temperature, top_k, top_p)
    ]
    width = max_output_length or ops.shape(source_ids)[1] + extra_length
    if uniforms is None:
        uniforms = keras.random.uniform((width, ops.shape(rows)[0]), seed=seed)  # (T, B * N)
    else:
        uniforms = ops.transpose(ops.reshape(uniforms, (ops.shape(rows)[0], -1)))  # (T', B * N)

    def draw(log_probs, index, row_ids):
        row_settings = [
            value if _is_number(value) else ops.take(value, row_ids) for value in settings
        ]  # (R,) each
        filtered = filter_log_probs(log_probs, *row_settings)
        uniform = ops.take(ops.take(uniforms, index, axis=0), row_ids)  # (R,)
        ids = _inverse_cdf(filtered, uniform)
        return ids, ops.take_along_axis(log_probs, ids[:, None], axis=-1)[:, 0]

    options = (max_output_length, extra_length, use_cache, static_shapes, prefix)
    tokens, totals, _, attention = search_rows(
        model, rows, draw, *options, return_attention, controls=controls
    )
    tokens = ops.reshape(tokens, (batch_size, num_samples, -1))  # (B, N, T)
    totals = ops.reshape(totals, (batch_size, num_samples))
    if not return_attention:
        return tokens, totals
    shape = (batch_size, num_samples, ops.shape(tokens)[-1], ops.shape(source_ids)[1])
    return tokens, totals, ops.reshape(attention, shape)  # (B, N, T, S)
