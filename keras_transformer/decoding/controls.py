"""Production controls on a search's next-token logits: repetition, length, banned tokens.

Each control is a cut of the logits before the softmax, as CTranslate2 and
Hugging Face apply them: the repetition penalty rescales the logits of tokens
already in the output, and the bans make tokens impossible. Beam scores and
sampling probabilities then follow from the cut distribution (its
log-softmax), so a banned token has no probability mass to lose.

A row's output, for every control, is the tokens produced so far: a target
prefix included, the start token not. The rules are CTranslate2's:
- `repetition_penalty` p: a token already in the output has its logit
  divided by p when positive, multiplied by p when negative (Keskar et al.,
  2019), once however often it occurs;
- `no_repeat_ngram_size` n: where the output's last n - 1 tokens occurred
  before, the token that followed them then is banned, so no n-gram occurs
  twice (n = 1 bans every token already produced);
- `min_length` m: the end token is banned while fewer than m tokens were
  produced;
- `max_length` l: the output stops after l tokens, the end token included;
- `disable_unk`: the model's `unk_id` is banned;
- `banned_tokens`: a token id is banned everywhere; a sequence of ids has its
  last one banned where the output ends with the others.
Rows inside their target prefix are not cut: the prefix is forced whatever
the controls say.

Each setting is a Python value, the same for every sentence, or a tensor with
one value a sentence (the SavedModel's per-request settings): int `(B,)` for
the sizes and lengths, float `(B,)` for the penalty, bool `(B,)` for
`disable_unk`, and int `(B, N, L)` for banned sequences.
"""

import dataclasses
import numbers
from typing import Any, ClassVar

import numpy as np
from keras import ops

from keras_transformer.decoding.steps import IMPOSSIBLE

# The id that fills banned sequences shorter than the longest: it matches any token.
ANY_TOKEN = -1


def banned_sequences(banned_tokens):
    """Banned token ids and sequences as one int32 array `(N, L)`, right-aligned.

    Args:
        banned_tokens: iterable whose items are an int (one token, banned
            everywhere) or a sequence of ints (its last token banned where
            the output ends with the others).

    Returns:
        int32 NumPy `(N, L)`: each sequence at the right end of its row, the
        row filled on the left with `ANY_TOKEN`.
    """
    sequences = [
        [item] if isinstance(item, numbers.Integral) else list(item) for item in banned_tokens
    ]
    for sequence in sequences:
        if not sequence or any(
            not isinstance(token, numbers.Integral) or token < 0 for token in sequence
        ):
            raise ValueError(
                "banned_tokens must hold token ids (ints >= 0) or non-empty sequences of them. "
                f"Received: {sequence}"
            )
    width = max((len(sequence) for sequence in sequences), default=1)
    rows = [[ANY_TOKEN] * (width - len(sequence)) + sequence for sequence in sequences]
    return np.array(rows, "int32").reshape(len(rows), width)


def _is_python(value):
    return isinstance(value, (numbers.Number, bool)) or value is None


@dataclasses.dataclass(frozen=True, eq=False)  # eq: banned_tokens may be an array
class DecodingControls:
    """The decoding controls of a search, checked, with their neutral values.

    One value holds all six controls (the module docstring gives their
    rules); every search takes it as `controls=` (or a dict of its fields),
    and the SavedModel's signatures, `kt translate` and the checks of
    per-sentence tensors derive their names, dtypes and neutral values from
    `SETTINGS`. A control left at its neutral value costs nothing: the search
    traces as without it.

    Each setting is a Python value, the same for every sentence, or a tensor
    with one value a sentence: int `(B,)` for the sizes and lengths, float
    `(B,)` for the penalty, bool `(B,)` for `disable_unk`. Python values are
    checked here; tensors with `rules`, by the caller, in its own graph.

    Args:
        no_repeat_ngram_size: int, no n-gram of this size occurs twice (0: off).
        repetition_penalty: float > 0, rescales the logits of tokens already
            produced (1: off).
        min_length: int, the end token is banned before this many tokens (0: off).
        max_length: int or None, the most tokens of an output, the end
            included (0 or None: the search's own limit).
        disable_unk: bool, the model's `unk_id` is never produced.
        banned_tokens: None, an iterable whose items are token ids (banned
            everywhere) or id sequences (the last id banned where the output
            ends with the others), or an int tensor `(N, L)` or `(B, N, L)`
            laid out as `banned_sequences` lays them out.

    Example:
    >>> controls = DecodingControls(no_repeat_ngram_size=3, banned_tokens=[7, (5, 9)])
    >>> sorted(controls.active())
    ['banned_tokens', 'no_repeat_ngram_size']
    """

    # Each setting's dtype and neutral value (banned_tokens aside: None).
    SETTINGS: ClassVar[dict] = {
        "no_repeat_ngram_size": ("int32", 0),
        "repetition_penalty": ("float32", 1.0),
        "min_length": ("int32", 0),
        "max_length": ("int32", 0),
        "disable_unk": ("bool", False),
    }

    no_repeat_ngram_size: Any = 0
    repetition_penalty: Any = 1.0
    min_length: Any = 0
    max_length: Any = 0
    disable_unk: Any = False
    banned_tokens: Any = None

    def __post_init__(self):
        if self.max_length is None:
            object.__setattr__(self, "max_length", 0)
        settings = self.settings()
        python = {name: value for name, value in settings.items() if _is_python(value)}
        for valid, message, names in self.rules(settings):
            if all(name in python for name in names) and not valid:
                shown = ", ".join(f"{name}={python[name]}" for name in names)
                raise ValueError(f"{message}. Received: {shown}")
        if self.banned_tokens is not None and not hasattr(self.banned_tokens, "shape"):
            object.__setattr__(self, "banned_tokens", banned_sequences(list(self.banned_tokens)))

    @classmethod
    def coerce(cls, controls):
        """`controls` as a `DecodingControls`: one already, a dict of its fields, or None."""
        if controls is None or isinstance(controls, cls):
            return controls
        if isinstance(controls, dict):
            unknown = sorted(set(controls) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise ValueError(
                    f"Unknown decoding controls: {unknown}. Known: {sorted(cls.SETTINGS)} and "
                    "banned_tokens"
                )
            return cls(**controls)
        raise TypeError(
            "controls must be a DecodingControls, a dict of its fields or None. "
            f"Received: {type(controls).__name__}"
        )

    def settings(self):
        """The five settings other than `banned_tokens`, by name (dict)."""
        return {name: getattr(self, name) for name in self.SETTINGS}

    def get_config(self):
        """The controls as plain Python values (JSON-ready); `from_config` rebuilds them.

        Banned sequences `(N, L)` come back as id lists without their padding; one
        sentence's each `(B, N, L)` stays laid out, -1 for any token.
        """
        config = {
            name: ops.convert_to_numpy(value).tolist() if hasattr(value, "shape") else value
            for name, value in self.settings().items()
        }
        banned = self.banned_tokens
        if banned is not None:
            banned = ops.convert_to_numpy(banned)
            if banned.ndim == 2:
                banned = [[int(t) for t in row if t != ANY_TOKEN] for row in banned]
            else:
                banned = banned.tolist()
        return {**config, "banned_tokens": banned}

    @classmethod
    def from_config(cls, config):
        """The `DecodingControls` of `get_config()`'s dict."""
        banned = config.get("banned_tokens")
        if banned and isinstance(banned[0], list) and banned[0] and isinstance(banned[0][0], list):
            config = {**config, "banned_tokens": np.array(banned, "int32")}  # (B, N, L)
        return cls(**config)

    @staticmethod
    def rules(settings):
        """The checks of the settings: `[(valid, message, names)]`.

        Each `valid` is a bool for Python values or a bool tensor `(B,)` for
        a sentence's values (written with operators, so it is either), and
        `names` the settings it reads.

        Args:
            settings: dict of the five settings (`SETTINGS`' names).
        """
        size, penalty = settings["no_repeat_ngram_size"], settings["repetition_penalty"]
        shortest, longest = settings["min_length"], settings["max_length"]
        return [
            (
                size >= 0,
                "no_repeat_ngram_size must be 0 (off) or positive",
                ["no_repeat_ngram_size"],
            ),
            (
                (penalty > 0) & (penalty < float("inf")),
                "repetition_penalty must be positive and finite",
                ["repetition_penalty"],
            ),
            (shortest >= 0, "min_length must be 0 (off) or positive", ["min_length"]),
            (longest >= 0, "max_length must be 0 (off) or positive", ["max_length"]),
            (
                (longest == 0) | (shortest <= longest),
                "min_length must not exceed max_length",
                ["min_length", "max_length"],
            ),
        ]

    def active(self):
        """The controls a search applies, as a dict; None when all are neutral.

        Python values at their neutral value are dropped, so a search without
        controls traces exactly as before; tensors are kept. `banned_tokens`
        becomes an int32 tensor `(N, L)` or `(B, N, L)`, dropped when it bans
        nothing.
        """
        controls = {
            name: value
            for name, value in self.settings().items()
            if not (_is_python(value) and value == self.SETTINGS[name][1])
        }
        banned = self.banned_tokens
        if banned is not None:
            if len(banned.shape) == 1:  # ids
                banned = ops.expand_dims(banned, -1)
            if len(banned.shape) not in (2, 3):
                raise ValueError(
                    "banned_tokens must be ids and id sequences, or a tensor (N, L) or "
                    f"(B, N, L). Received: shape={banned.shape}"
                )
            if banned.shape[-2] != 0:  # none banned: nothing to do
                controls["banned_tokens"] = ops.convert_to_tensor(banned, "int32")
        return controls or None


def check_controls(controls):
    """A search's `controls` argument as the dict the steps read, or None (`active`)."""
    controls = DecodingControls.coerce(controls)
    return None if controls is None else controls.active()


def limit_lengths(limits, controls):
    """Each sentence's output limit `(B,)` lowered to its `max_length`, where one is set."""
    if not controls or "max_length" not in controls:
        return limits
    max_length = ops.cast(controls["max_length"], "int32")
    lowered = ops.minimum(limits, max_length)
    return ops.where(max_length > 0, lowered, limits)  # 0: no limit of its own


def _per_row(value, rows, dtype):
    """A setting for each row `(R,)`: a Python value broadcast, or a sentence's `(B,)` value."""
    if _is_python(value):
        return ops.full(ops.shape(rows), value, dtype=dtype)
    return ops.take(ops.cast(value, dtype), rows, axis=0)


def _cells(ids, wanted, vocabulary_size):
    """Int `(R * M, 2)` the (row, id) cells of `ids` `(R, M)`, column V where not `wanted`.

    The cells not wanted land in an extra column V that is dropped afterwards:
    a fixed shape, so one scatter serves every row (PyTorch's `ops.scatter`, a
    sum, would loop in Python over entries; `scatter_update` does not).
    """
    rows, width = ops.shape(ids)[0], ops.shape(ids)[1]
    row_ids = ops.broadcast_to(ops.arange(rows, dtype="int32")[:, None], (rows, width))
    wanted = wanted & (ids >= 0) & (ids < vocabulary_size)
    columns = ops.where(wanted, ids, vocabulary_size)  # (R, M)
    return ops.reshape(ops.stack([row_ids, columns], axis=-1), (-1, 2))


def _column(history, position):
    """Column `position` of `(R, T)` history, -2 (no token) where `position` is negative."""
    column = ops.take(history, ops.maximum(position, 0), axis=1)
    return ops.where(position >= 0, column, -2)


def _repeated_ngram_ends(history, index, sizes, largest):
    """Bool `(R, T)`: positions whose token would repeat an n-gram if produced next.

    Position f qualifies where f < index, the n - 1 tokens before f equal the
    output's last n - 1, and n > 0 (`sizes` `(R,)`). `largest`, the largest
    n (a Python int, or a scalar tensor for per-sentence sizes), bounds the
    loop over the tokens compared.
    """
    positions = ops.arange(ops.shape(history)[1], dtype="int32")[None]  # (1, T)
    match = (positions < index) & (positions >= sizes[:, None] - 1) & (sizes[:, None] > 0)

    def compare(offset, match):
        earlier = _shifted(history, offset)  # (R, T): the token `offset` before f
        latest = _column(history, index - offset)[:, None]  # (R, 1)
        return match & ((earlier == latest) | (offset >= sizes[:, None]))

    return ops.fori_loop(1, largest, compare, match)


def _shifted(history, shift):
    """`history` `(R, T)` moved `shift` right: column t holds column t - shift (-2 before 0)."""
    width = ops.shape(history)[1]
    source = ops.arange(width, dtype="int32") - shift  # (T,)
    moved = ops.take(history, ops.maximum(source, 0), axis=1)
    return ops.where((source >= 0)[None], moved, -2)


def _banned_sequence_ends(history, index, sequences):
    """Int `(R, N)` ids to ban (-1: none): a sequence's last id where the output ends with the rest.

    Args:
        history: int `(R, T)`.
        index: int scalar, the position decoded.
        sequences: int `(R, N, L)`, right-aligned, `ANY_TOKEN` on the left.
    """
    length = ops.shape(sequences)[-1]
    offsets = ops.arange(length - 1, dtype="int32")  # (L - 1,)
    positions = index - (length - 1) + offsets
    recent = ops.take(history, ops.maximum(positions, 0), axis=1)  # (R, L - 1)
    recent = ops.where((positions >= 0)[None], recent, -2)
    before = sequences[..., :-1]  # (R, N, L - 1)
    matches = ops.all((before == ANY_TOKEN) | (before == recent[:, None, :]), axis=-1)  # (R, N)
    return ops.where(matches, sequences[..., -1], -1)


def apply_controls(model, logits, history, index, row_sentences, controls):
    """A step's logits `(R, V)` cut by the controls (see the module docstring).

    The cuts write only the cells they change: the penalty gathers the logits
    of the `(R, T)` tokens produced and scatters them back rescaled, and every
    ban (repeated n-grams, `min_length`, `disable_unk`, banned sequences) goes
    into one scatter of `IMPOSSIBLE`. Beyond those, a step copies the `(R, V)`
    logits a few times (into a scratch column and out, and a scatter's copy
    where the backend makes one), and builds no `(R, V)` mask.

    Args:
        model: the model searched (its `eos_id`, `unk_id`).
        logits: float32 `(R, V)` next-token logits.
        history: int `(R, T)` each row's tokens so far (positions from `index`
            on are not read).
        index: int scalar, the position decoded.
        row_sentences: int `(R,)` the sentence of each row (for per-sentence
            settings).
        controls: dict from `check_controls`.

    Returns:
        float32 `(R, V)` logits: penalized, banned tokens `IMPOSSIBLE`.
    """
    logits = ops.cast(logits, "float32")
    rows, vocabulary_size = ops.shape(logits)[0], ops.shape(logits)[-1]
    # Column V, a scratch column, receives the cells not wanted: whatever
    # their writes leave there is dropped at the end.
    cut = ops.concatenate([logits, ops.zeros_like(logits[:, :1])], axis=1)
    if "repetition_penalty" in controls:
        positions = ops.arange(ops.shape(history)[1], dtype="int32")[None]  # (1, T)
        produced = ops.broadcast_to(positions < index, ops.shape(history))  # (R, T)
        tokens = ops.clip(history, 0, vocabulary_size - 1)
        values = ops.take_along_axis(logits, tokens, axis=1)  # (R, T)
        penalty = _per_row(controls["repetition_penalty"], row_sentences, "float32")[:, None]
        values = ops.where(values < 0, values * penalty, values / penalty)
        # A token produced twice gets the same value twice, so the order of writes to
        # a cell does not matter (outside the scratch column).
        cells = _cells(history, produced, vocabulary_size)
        cut = ops.scatter_update(cut, cells, ops.reshape(values, (-1,)))
    banned = []  # int (R, M) each: ids to ban, -1 for none
    if "no_repeat_ngram_size" in controls:
        size = controls["no_repeat_ngram_size"]
        sizes = _per_row(size, row_sentences, "int32")
        largest = size if _is_python(size) else ops.max(sizes)
        ends = _repeated_ngram_ends(history, index, sizes, largest)  # (R, T)
        banned.append(ops.where(ends, history, -1))
    if "min_length" in controls:
        short = index < _per_row(controls["min_length"], row_sentences, "int32")  # (R,)
        banned.append(ops.where(short, model.eos_id, -1)[:, None])
    if "disable_unk" in controls:
        disabled = _per_row(controls["disable_unk"], row_sentences, "bool")
        banned.append(ops.where(disabled, model.unk_id, -1)[:, None])
    if "banned_tokens" in controls:
        sequences = controls["banned_tokens"]
        if len(sequences.shape) == 2:  # the same for every sentence
            sequences = ops.broadcast_to(sequences[None], (rows, *ops.shape(sequences)))
        else:
            sequences = ops.take(sequences, row_sentences, axis=0)  # (R, N, L)
        banned.append(_banned_sequence_ends(history, index, sequences))  # (R, N)
    if banned:
        ids = ops.concatenate([ops.cast(ids, "int32") for ids in banned], axis=1)  # (R, M)
        cells = _cells(ids, ids >= 0, vocabulary_size)
        impossible = ops.full((ops.shape(cells)[0],), IMPOSSIBLE, dtype="float32")
        cut = ops.scatter_update(cut, cells, impossible)
    return cut[:, :vocabulary_size]
