"""Constrained decoding: outputs that are well-formed bracketings over the source's words.

A sequence-to-sequence parser (Vinyals et al., 2015; section 6.3 of the
paper) writes a tree depth-first: `(S (NP DT NN )NP (VP VBZ )VP . )S`, one
tag per source word. Unconstrained, a search may write too many or too few
tags, or brackets that do not match, and the output must be repaired. A
`BracketConstraint` passed to `greedy_search` or `beam_search` (`constraint=`)
lets each hypothesis extend only to sequences that can still end as one
well-formed tree over exactly the source's words within its length limit, so
every output reads back without repair; the model's probabilities choose
among the allowed tokens.

The state (open brackets, the innermost one, tags written) is recomputed
from each hypothesis's tokens at every step: one pass over `(R, T)` ids,
small beside the decoder step, and nothing to reorder when beams are
gathered.
"""

import numpy as np
from keras import ops

from keras_transformer.decoding.steps import IMPOSSIBLE

# Kinds of target token.
_OTHER, _OPEN, _CLOSE, _LEAF = 0, 1, 2, 3


class BracketConstraint:
    """Restricts a search to one labelled bracketing with one leaf per source word.

    Allowed at each step, where `depth` is the number of open brackets,
    `left` the source words without a leaf yet and `room` the tokens the
    hypothesis may still produce (its length limit minus the position):
    - an opening bracket, while words are left, fewer than `max_depth`
      brackets are open, and `room` can still hold the bracket, its close, a
      leaf for each word left, the closes of the open brackets and the end;
    - a leaf (a tag), inside a bracket, while words are left;
    - the closing bracket that matches the innermost open one, once the
      constituent it closes has a leaf, and unless it would close the root
      while words are left;
    - the end of sequence, once all brackets are closed and every word has
      its leaf.
    Every other token (source-only pieces, padding, start) is impossible. A
    row where nothing would be allowed (a limit too short for its words) is
    left unconstrained. Source and output ids share the vocabulary.

    A source's words are its ids in `word_starts`: with a SentencePiece
    vocabulary, a sentence's words once the tokenizer has normalised it, as
    many as its space-separated words for plain text (a source cut to a
    maximum length has only the words it kept).

    Args:
        vocabulary_size: int `V`.
        brackets: dict of int to int, each opening bracket's id to its
            closing bracket's id.
        leaves: iterable of int, the ids of the tags (one a word).
        word_starts: iterable of int, the source ids that begin a word
            (SentencePiece pieces starting with the word mark).
        eos_id: int, the end-of-sequence id.
        max_depth: int or None, the most brackets open at once (None: no
            limit but the length).

    Call arguments:
        log_probs: float32 `(R, V)` next-token log-probabilities.
        history: int `(R, T)` tokens produced so far (positions from `index`
            on are ignored).
        index: int scalar, the position being decoded.
        source_ids: int `(R, S)` each row's source.
        limits: int `(R,)` the most tokens each row may produce.

    Returns:
        float32 `(R, V)`, disallowed tokens at `IMPOSSIBLE`.

    Example:
    >>> constraint = BracketConstraint(
    ...     8, brackets={4: 5}, leaves=[6], word_starts=[7], eos_id=3)
    >>> log_probs = constraint(keras.ops.zeros((1, 8)), keras.ops.zeros(
    ...     (1, 4), "int32"), 0, keras.ops.array([[7, 7, 3]]), keras.ops.array([6]))
    >>> int(keras.ops.argmax(log_probs[0]))  # only the opening bracket
    4

    References:
        Vinyals et al., 2015, "Grammar as a Foreign Language"; Vaswani et
        al., 2017, section 6.3.
    """

    def __init__(self, vocabulary_size, brackets, leaves, word_starts, eos_id, max_depth=None):
        kinds = np.full((vocabulary_size,), _OTHER, dtype="int32")
        closers = np.full((vocabulary_size,), -1, dtype="int32")
        for opening, closing in brackets.items():
            kinds[opening], kinds[closing], closers[opening] = _OPEN, _CLOSE, closing
        kinds[list(leaves)] = _LEAF
        starts = np.zeros((vocabulary_size,), dtype="bool")
        starts[list(word_starts)] = True
        self.vocabulary_size = vocabulary_size
        self.eos_id = eos_id
        self.max_depth = max_depth
        self.kinds, self.closers, self.starts = kinds, closers, starts

    def __call__(self, log_probs, history, index, source_ids, limits):
        kinds = ops.convert_to_tensor(self.kinds)
        history = ops.convert_to_tensor(history, "int32")
        written = ops.arange(ops.shape(history)[1]) < index  # (T,)
        kind = ops.where(written[None], ops.take(kinds, history), _OTHER)  # (R, T)
        step = ops.cast(kind == _OPEN, "int32") - ops.cast(kind == _CLOSE, "int32")
        depth_after = ops.cumsum(step, axis=1)  # (R, T) open brackets after each token
        depth = ops.sum(step, axis=1)  # (R,)
        leaves_after = ops.cumsum(ops.cast(kind == _LEAF, "int32"), axis=1)  # (R, T)
        leaves = ops.sum(ops.cast(kind == _LEAF, "int32"), axis=1)  # (R,)
        words = ops.sum(
            ops.cast(ops.take(ops.convert_to_tensor(self.starts), source_ids), "int32"), axis=1
        )  # (R,)
        left = words - leaves
        room = ops.convert_to_tensor(limits, "int32") - index
        # The innermost open bracket is the last one after which the depth is
        # the current depth: any later bracket at that depth was closed again.
        positions = ops.arange(ops.shape(history)[1], dtype="int32")[None]  # (1, T)
        innermost = (kind == _OPEN) & (depth_after == depth[:, None])
        top = ops.max(ops.where(innermost, positions, -1), axis=1)  # (R,), -1: none open
        top_at = ops.maximum(top, 0)[:, None]
        top_token = ops.take_along_axis(history, top_at, axis=1)[:, 0]
        closing = ops.take(ops.convert_to_tensor(self.closers), top_token)  # (R,)
        filled = leaves - ops.take_along_axis(leaves_after, top_at, axis=1)[:, 0] > 0

        # Each rule keeps room for the shortest ending: a leaf per word left,
        # a close per open bracket, and the end of sequence.
        may_open = (left > 0) & (room >= left + depth + 3)
        if self.max_depth is not None:
            may_open = may_open & (depth < self.max_depth)
        may_leaf = (left > 0) & (depth > 0) & (room >= left + depth + 1)
        may_close = (top >= 0) & filled & ((depth > 1) | (left == 0)) & (room >= left + depth + 1)
        may_end = (depth == 0) & (left == 0) & (leaves > 0)
        vocabulary = ops.arange(self.vocabulary_size, dtype="int32")[None]  # (1, V)
        allowed = (
            ((kinds[None] == _OPEN) & may_open[:, None])
            | ((kinds[None] == _LEAF) & may_leaf[:, None])
            | ((vocabulary == closing[:, None]) & may_close[:, None])
            | ((vocabulary == self.eos_id) & may_end[:, None])
        )  # (R, V)
        anything = ops.any(allowed, axis=1, keepdims=True)
        allowed = allowed | ops.logical_not(anything)
        return ops.where(allowed, log_probs, IMPOSSIBLE)
