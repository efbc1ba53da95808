"""What both searches share: the decoding steps, the length penalty, row bookkeeping."""

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
