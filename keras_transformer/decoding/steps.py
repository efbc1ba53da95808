"""What the searches share: decoding steps, the length penalty, row bookkeeping.

Public so that a search of your own (sampling, constrained decoding) can be
built from the same pieces as `greedy_search` and `beam_search`:
`prepare_search` sets a search up and returns a `SearchSetup`; `guide` applies
the banned tokens, a constraint and a forced prefix to a step's
log-probabilities; `gather_rows` and `write_column` are the bookkeeping every
step does.
"""

import collections

import keras
from keras import ops

# Log-probability of an impossible hypothesis; finite so sums stay finite.
IMPOSSIBLE = -1e9


# The length penalty's forms, as the offset `k` of `((k + |Y|) / (k + 1)) ** alpha`.
PENALTY_FORMS = {"gnmt": 5.0, "power": 0.0}


def length_penalty(length, alpha, form="gnmt"):
    """The length penalty a hypothesis's log-probability is divided by.

    Two forms: GNMT's `((5 + length) / 6) ** alpha` (Wu et al.; the paper's,
    with alpha 0.6), and `length ** alpha`, the form of `transformers`'
    `length_penalty` and CTranslate2's. Both are `((k + length) / (k + 1)) **
    alpha` with `k` 5 or 0, which lets a graph choose the form per request.

    Args:
        length: int or tensor of token counts (end-of-sequence included).
        alpha: float, 0 for none; the paper uses 0.6.
        form: "gnmt" or "power", or a float scalar tensor `k` (see above).

    Returns:
        float32 tensor shaped like `length`.

    References:
        Wu et al., 2016, section 7; Vaswani et al., 2017, section 6.1.
    """
    offset = penalty_offset(form)
    length = ops.cast(length, "float32")
    return ops.power((offset + length) / (offset + 1.0), alpha)


def penalty_offset(form):
    """The offset `k` of a length penalty form (see `length_penalty`); a tensor passes through."""
    if not isinstance(form, str):
        return ops.cast(form, "float32")
    if form not in PENALTY_FORMS:
        raise ValueError(
            f"penalty_form must be one of {sorted(PENALTY_FORMS)}. Received: penalty_form={form!r}"
        )
    return PENALTY_FORMS[form]


class CachedSteps:
    """The model's own incremental decoding: key/value caches, one position a step.

    `start` also takes the model's `step_constants()` (where it has them) once,
    outside the search's loop, and `step` passes them to every step: one
    stepper serves one search, its `step`s traced where its `start` was.
    """

    def __init__(self, model):
        self.model = model
        self.constants = {}

    def start(self, source_ids, cache_length, return_attention=False):
        step_constants = getattr(self.model, "step_constants", None)
        self.constants = step_constants() if step_constants is not None else {}
        if not return_attention:  # the interface of models without alignments
            return self.model.start_decoding(source_ids, cache_length)
        return self.model.start_decoding(source_ids, cache_length, return_attention=True)

    def step(self, token_ids, state, index, normalize=True):
        options = {} if normalize else {"normalize": False}  # models without logits
        if self.constants:  # models without constants
            options["constants"] = self.constants
        return self.model.decoding_step(token_ids, state, index, **options)


class RecomputedSteps:
    """The reference decoder: runs the whole prefix through the model every step.

    Its state is the encoder output and the prefix decoded so far, a growing
    `(R, t)` tensor, or with `index` a fixed `(R, cache_length)` buffer of which
    the decoder runs every position and the step reads one.
    """

    def __init__(self, model):
        self.model = model

    def start(self, source_ids, cache_length, return_attention=False):
        encoder_outputs, padding_mask = self.model.encode(source_ids)
        rows = ops.shape(source_ids)[0]
        prefix = ops.full((rows, cache_length), self.model.pad_id, dtype="int32")
        target = {"prefix": prefix}
        if return_attention:
            target["attention"] = ops.zeros(ops.shape(source_ids), dtype="float32")
        return {
            "source": {"encoder_outputs": encoder_outputs, "padding_mask": padding_mask},
            "target": target,
        }

    def step(self, token_ids, state, index, normalize=True):
        source, prefix = state["source"], state["target"]["prefix"]
        if index is None:
            prefix = ops.concatenate([prefix, token_ids[:, None]], axis=1)  # (R, t + 1)
            position = ops.shape(prefix)[1] - 1
        else:
            prefix = write_column(prefix, index, token_ids)  # (R, cache_length)
            position = index
        alignment = "attention" in state["target"]
        outputs = self.model.decode(
            prefix,
            source["encoder_outputs"],
            source["padding_mask"],
            return_attention_scores=alignment,
        )  # (R, T, V)[, (R, L, H, T, S)]
        logits = ops.take(outputs[0] if alignment else outputs, position, axis=1)  # (R, V)
        target = {"prefix": prefix}
        if alignment:  # the last layer's at this position, averaged over heads
            scores = ops.take(outputs[1][:, -1], position, axis=2)  # (R, H, S)
            target["attention"] = ops.mean(ops.cast(scores, "float32"), axis=1)
        scores = ops.log_softmax(logits, axis=-1) if normalize else logits
        return scores, {"source": source, "target": target}


def gather_rows(tree, rows):
    """Rows `(R',)` of every tensor in a nested structure.

    Args:
        tree: nested structure of tensors `(R, ...)`.
        rows: int `(R',)` row indices.

    Returns:
        the same structure of `(R', ...)` tensors.
    """
    return keras.tree.map_structure(lambda tensor: ops.take(tensor, rows, axis=0), tree)


def _traced_zero(source_ids):
    """An int32 zero computed from the values of `source_ids`.

    Sizes offset by it are unknown while tracing, whatever the shapes: TensorFlow's
    `while_loop` keeps each loop variable's traced shape, so rows and caches
    sized from it may grow and shrink from step to step.
    """
    corner = source_ids[:1, :1]
    return ops.sum(ops.cast(ops.not_equal(corner, corner), "int32"))


def write_column(tokens, index, ids):
    """`tokens` `(R, T)` with column `index` set to `ids` `(R,)`.

    `where`, not `ops.slice_update`, which TensorFlow lowers to
    XlaDynamicUpdateSlice, an op TF Serving runs only with XLA compilation
    enabled.
    """
    column = ops.arange(ops.shape(tokens)[-1]) == index  # (T,)
    return ops.where(column, ops.expand_dims(ids, -1), tokens)


def ban_special_tokens(model, log_probs):
    """`(R, V)` log-probabilities with `model.pad_id` and `model.bos_id` made impossible."""
    ids = ops.arange(ops.shape(log_probs)[-1])
    banned = ops.equal(ids, model.pad_id) | ops.equal(ids, model.bos_id)  # (V,)
    return ops.where(banned, IMPOSSIBLE, log_probs)


SearchSetup = collections.namedtuple(
    "SearchSetup", ["limits", "width", "steps", "state", "rows", "static"]
)
SearchSetup.__doc__ = """What `prepare_search` returns.

Fields:
    limits: int `(B,)`, the most tokens each sentence may produce.
    width: int, the output width `T`, as wide as the longest possible output
        (`S + extra_length` for a padded width `S`, static wherever `S` is).
    steps: the stepper (`CachedSteps` or `RecomputedSteps`).
    state: its decoder state for the `B` sentences.
    rows: int32 `(B,)` sentence ids of the rows.
    static: bool, whether shapes stay static (fixed-size caches, finished rows
        kept) or rows may leave the batch as they finish.
"""


def prepare_search(
    model,
    source_ids,
    max_output_length=None,
    extra_length=50,
    use_cache=True,
    static_shapes=None,
    return_attention=False,
):
    """Sets a search up: output limits, stepper, initial state and rows.

    Args:
        model: a built `Transformer` (see `greedy_search`).
        source_ids: int `(B, S)` source ids, padded with `model.pad_id`.
        max_output_length: int or None, the most target tokens for every
            sentence; defaults to each source's length plus `extra_length`.
        extra_length: int, see `max_output_length`.
        use_cache: bool, `CachedSteps` (True) or `RecomputedSteps`.
        static_shapes: bool or None; None chooses static shapes on JAX only.
        return_attention: bool, each step's state keeps its alignment
            (`state["target"]["attention"]`, float32 `(R, S)`).

    Returns:
        a `SearchSetup`.
    """
    on_jax = keras.backend.backend() == "jax"
    if on_jax and static_shapes is False:
        raise ValueError(
            "static_shapes=False needs a backend with dynamic shapes (TensorFlow, PyTorch): "
            "JAX's while_loop keeps every shape fixed. Received: static_shapes=False"
        )
    static = on_jax if static_shapes is None else static_shapes
    batch_size = ops.shape(source_ids)[0]
    if max_output_length is not None:
        limits = ops.full((batch_size,), max_output_length, dtype="int32")
        width = max_output_length
    else:
        lengths = ops.sum(ops.cast(model.padding_mask(source_ids), "int32"), axis=1)  # (B,)
        limits, width = lengths + extra_length, ops.shape(source_ids)[1] + extra_length
    steps = CachedSteps(model) if use_cache else RecomputedSteps(model)
    if static:
        state = steps.start(source_ids, width, return_attention)
        rows = ops.arange(batch_size, dtype="int32")
    else:  # caches that grow, batches that shrink
        zero = _traced_zero(source_ids)
        state = steps.start(source_ids, zero, return_attention)
        rows = ops.arange(batch_size + zero, dtype="int32")
    return SearchSetup(limits, width, steps, state, rows, static)


def force_prefix(log_probs, target_prefix, row_sentences, index, pad_id):
    """`(R, V)` log-probabilities where rows inside their prefix can only produce it.

    While `index` is inside row `r`'s sentence's prefix, every token but the
    prefix's next one is made impossible, so any search takes the prefix token
    and scores it by the model's own log-probability (a forced token).

    Args:
        log_probs: float32 `(R, V)` next-token log-probabilities.
        target_prefix: int `(B, P)` prefixes padded with `pad_id`, or None.
        row_sentences: int `(R,)` sentence of each row.
        index: int scalar, the position being decoded.
        pad_id: int, the padding id.

    Returns:
        float32 `(R, V)`.
    """
    if not _has_prefix(target_prefix):
        return log_probs
    prefix = ops.take(target_prefix, row_sentences, axis=0)  # (R, P)
    position = ops.minimum(index, ops.shape(prefix)[1] - 1)
    token = ops.take(prefix, position, axis=1)  # (R,)
    vocabulary = ops.arange(ops.shape(log_probs)[-1], dtype="int32")  # (V,)
    forced = ops.expand_dims(_in_prefix(prefix, index, pad_id), 1)  # (R, 1)
    allowed = ops.equal(vocabulary[None], ops.expand_dims(token, 1)) | ops.logical_not(forced)
    return ops.where(allowed, log_probs, IMPOSSIBLE)


def _has_prefix(target_prefix):
    return target_prefix is not None and target_prefix.shape[1] != 0


def _in_prefix(prefix, index, pad_id):
    """Bool `(R,)`: rows whose prefix `(R, P)` (padded with `pad_id`) still forces `index`."""
    lengths = ops.sum(ops.cast(ops.not_equal(prefix, pad_id), "int32"), axis=1)  # (R,)
    return index < lengths


def guide(model, log_probs, index, row_sentences, history, search):
    """A step's `(R, V)` log-probabilities restricted as the search asks.

    With decoding controls (`search["controls"]`, see `controls.py`), the
    step's scores are logits: on rows past their target prefix the controls
    cut them, and the log-softmax of the cut logits is the distribution the
    search follows. Then padding and start are banned (`ban_special_tokens`);
    then, on rows past their target prefix, the constraint removes what it
    does not allow; with `end_at_limit`, rows at their last position can only
    end; then rows inside their prefix can only produce it (`force_prefix`),
    whatever the constraint allows.

    Args:
        model: the model searched (its `pad_id`, `bos_id`).
        log_probs: float32 `(R, V)`, logits under controls.
        index: int scalar, the position being decoded.
        row_sentences: int `(R,)` sentence of each row.
        history: int `(R, T)` the rows' tokens so far (read only under a
            constraint or controls; None without them).
        search: dict with `prefix` (int `(B, P)` or None), `constraint`
            (callable or None, see `greedy_search`), `source_ids` int `(B, S)`,
            `limits` int `(B,)`, `controls` (dict or None) and optionally
            `end_at_limit` (bool, see `end_at_limit`).

    Returns:
        float32 `(R, V)`.
    """
    prefix, constraint = search["prefix"], search["constraint"]
    if search.get("controls"):
        log_probs = _controlled(model, log_probs, index, row_sentences, history, search)
    log_probs = ban_special_tokens(model, log_probs)
    if constraint is not None:
        sources = ops.take(search["source_ids"], row_sentences, axis=0)  # (R, S)
        limits = ops.take(search["limits"], row_sentences)  # (R,)
        constrained = constraint(log_probs, history, index, sources, limits)
        if not _has_prefix(prefix):
            log_probs = constrained
        else:  # the constraint starts where the prefix ends
            rows_prefix = ops.take(prefix, row_sentences, axis=0)  # (R, P)
            free = ops.logical_not(_in_prefix(rows_prefix, index, model.pad_id))
            log_probs = ops.where(free[:, None], constrained, log_probs)
    if search.get("end_at_limit"):
        log_probs = end_at_limit(model, log_probs, index, ops.take(search["limits"], row_sentences))
    return force_prefix(log_probs, prefix, row_sentences, index, model.pad_id)


def end_at_limit(model, log_probs, index, limits):
    """`(R, V)` log-probabilities where rows at their last position can only end.

    `transformers`' `forced_eos_token_id`: the last token a row's limit allows
    is `model.eos_id`, with log-probability 0 (the forced token adds nothing
    to the score), so a hypothesis cut by the limit still ends.

    Args:
        model: the model searched (its `eos_id`).
        log_probs: float32 `(R, V)`.
        index: int scalar, the position being decoded.
        limits: int `(R,)`, the most tokens each row may produce.
    """
    ids = ops.arange(ops.shape(log_probs)[-1])
    forced = ops.where(ops.equal(ids, model.eos_id), 0.0, IMPOSSIBLE)[None]  # (1, V)
    last = ops.expand_dims(index + 1 >= limits, 1)  # (R, 1)
    return ops.where(last, forced, log_probs)


def _controlled(model, logits, index, row_sentences, history, search):
    """Log-probabilities `(R, V)` of the logits cut by the controls, past each row's prefix."""
    from keras_transformer.decoding.controls import apply_controls  # it imports IMPOSSIBLE

    cut = apply_controls(model, logits, history, index, row_sentences, search["controls"])
    log_probs = ops.log_softmax(cut, axis=-1)
    prefix = search["prefix"]
    if not _has_prefix(prefix):
        return log_probs
    rows_prefix = ops.take(prefix, row_sentences, axis=0)  # (R, P)
    free = ops.logical_not(_in_prefix(rows_prefix, index, model.pad_id))
    return ops.where(free[:, None], log_probs, ops.log_softmax(logits, axis=-1))


def check_prefix(target_prefix):
    """`target_prefix` as an int32 tensor `(B, P)`, or None; ValueError for another rank."""
    if target_prefix is None:
        return None
    target_prefix = ops.convert_to_tensor(target_prefix, "int32")
    if len(target_prefix.shape) != 2:
        raise ValueError(
            f"target_prefix must be (B, P) token ids. Received: shape={target_prefix.shape}"
        )
    return target_prefix


def score_hypotheses(
    model, source_ids, target_ids, alpha=0.0, return_token_log_probs=False, penalty_form="gnmt"
):
    """Scores given translations under the model, as the decoders score them.

    Args:
        model: a built `Transformer`.
        source_ids: int `(B, S)` source ids.
        target_ids: int `(B, T)` hypotheses as the decoders return them: tokens,
            then `model.eos_id` (when produced), then `model.pad_id`.
        alpha: float, length penalty exponent.
        return_token_log_probs: bool, also return each token's log-probability.
        penalty_form: "gnmt" or "power", the length penalty's form (`length_penalty`).

    A hypothesis ended by `end_at_limit` scores its forced end by the model's
    log-probability here, where the search scored it 0.

    Returns:
        float32 `(B,)` log-probabilities divided by `length_penalty`; with
        `return_token_log_probs`, also float32 `(B, T)` log-probabilities of
        each target token given the source and the tokens before it (0 at
        padding; their sum is the score with `alpha=0`).
    """
    source_ids = ops.convert_to_tensor(source_ids, "int32")
    target_ids = ops.convert_to_tensor(target_ids, "int32")
    bos = ops.full((ops.shape(target_ids)[0], 1), model.bos_id, dtype="int32")
    inputs = ops.concatenate([bos, target_ids[:, :-1]], axis=1)  # (B, T)
    log_probs = ops.log_softmax(model((source_ids, inputs)), axis=-1)  # (B, T, V)
    picked = ops.take_along_axis(log_probs, target_ids[..., None], axis=-1)[..., 0]
    real = ops.not_equal(target_ids, model.pad_id)
    picked = ops.where(real, picked, 0.0)  # (B, T)
    lengths = ops.maximum(ops.sum(ops.cast(real, "int32"), axis=1), 1)  # (B,) an empty one: 1
    scores = ops.sum(picked, axis=1) / length_penalty(lengths, alpha, penalty_form)
    return (scores, picked) if return_token_log_probs else scores
