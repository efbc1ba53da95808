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

    With `copy_words`, the output writes each word before its tag
    (`(NP The DT dog NN )NP`), and the word is the source's: where a bracket
    or a tag could otherwise follow, the next source word's first id may
    follow instead (inside a bracket, while words are left); inside a word,
    only its next source id; once the word is written, only a tag. Brackets
    open and close only between words. The source's ids run up to its first
    `eos_id`; no word may begin with a bracket's id. The search then chooses
    where words go, not how they are spelt: a word's first id takes the
    model's probability of any word there, the ids continuing it are certain,
    so scores are not `score_hypotheses`'s.

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
        copy_words: bool, each leaf is the source word's ids, then a tag.

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

    def __init__(
        self,
        vocabulary_size,
        brackets,
        leaves,
        word_starts,
        eos_id,
        max_depth=None,
        copy_words=False,
    ):
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
        self.copy_words = copy_words
        self.kinds, self.closers, self.starts = kinds, closers, starts

    def _brackets(self, history, index):
        """The brackets' state: `(depth (R,), closing (R,), filled (R,), content (R,))`:
        the open brackets, the id closing the innermost one (-1: none open),
        whether that one holds a leaf, and the tokens written that are not
        brackets (leaves; with `copy_words`, words and tags)."""
        kinds = ops.convert_to_tensor(self.kinds)
        written = ops.arange(ops.shape(history)[1]) < index  # (T,)
        kind = ops.take(kinds, history)  # (R, T)
        step = ops.cast(written[None] & (kind == _OPEN), "int32") - ops.cast(
            written[None] & (kind == _CLOSE), "int32"
        )
        depth_after = ops.cumsum(step, axis=1)  # (R, T) open brackets after each token
        depth = ops.sum(step, axis=1)  # (R,)
        if self.copy_words:
            counted = (kind != _OPEN) & (kind != _CLOSE)
        else:
            counted = kind == _LEAF
        counted = ops.cast(written[None] & counted, "int32")
        content_after = ops.cumsum(counted, axis=1)  # (R, T)
        content = ops.sum(counted, axis=1)  # (R,)
        # The innermost open bracket is the last one after which the depth is
        # the current depth: any later bracket at that depth was closed again.
        positions = ops.arange(ops.shape(history)[1], dtype="int32")[None]  # (1, T)
        innermost = written[None] & (kind == _OPEN) & (depth_after == depth[:, None])
        top = ops.max(ops.where(innermost, positions, -1), axis=1)  # (R,), -1: none open
        top_at = ops.maximum(top, 0)[:, None]
        top_token = ops.take_along_axis(history, top_at, axis=1)[:, 0]
        closing = ops.where(top >= 0, ops.take(ops.convert_to_tensor(self.closers), top_token), -1)
        filled = content - ops.take_along_axis(content_after, top_at, axis=1)[:, 0] > 0
        return depth, closing, filled, content

    def __call__(self, log_probs, history, index, source_ids, limits):
        history = ops.convert_to_tensor(history, "int32")
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        depth, closing, filled, content = self._brackets(history, index)
        room = ops.convert_to_tensor(limits, "int32") - index
        starts = ops.take(ops.convert_to_tensor(self.starts), source_ids)  # (R, S)
        if self.copy_words:
            moves = self._copying(source_ids, starts, content)
        else:
            words = ops.sum(ops.cast(starts, "int32"), axis=1)  # (R,)
            between = content < words
            moves = {"between": ops.ones_like(between), "left": words - content, "next": None}
            moves.update(tag=between, piece=ops.zeros_like(between), remaining=words - content)
        left, remaining, between = moves["left"], moves["remaining"], moves["between"]
        # Each rule keeps room for the shortest ending: what the words left
        # need, a close per open bracket, and the end of sequence.
        fits = room >= remaining + depth + 1
        may_open = between & (left > 0) & (room >= remaining + depth + 3)
        if self.max_depth is not None:
            may_open = may_open & (depth < self.max_depth)
        may_leaf = moves["tag"] & (depth > 0) & fits
        may_piece = moves["piece"] & (depth > 0) & fits
        may_close = between & (closing >= 0) & filled & ((depth > 1) | (left == 0)) & fits
        may_end = (depth == 0) & (left == 0) & (content > 0)
        kinds = ops.convert_to_tensor(self.kinds)
        vocabulary = ops.arange(self.vocabulary_size, dtype="int32")[None]  # (1, V)
        allowed = (
            ((kinds[None] == _OPEN) & may_open[:, None])
            | ((kinds[None] == _LEAF) & may_leaf[:, None])
            | ((vocabulary == closing[:, None]) & may_close[:, None])
            | ((vocabulary == self.eos_id) & may_end[:, None])
        )  # (R, V)
        if moves["next"] is not None:
            copy = (vocabulary == moves["next"][:, None]) & may_piece[:, None]  # (R, V)
            allowed = allowed | copy
            log_probs = self._copy_probabilities(log_probs, copy, moves, kinds[None], vocabulary)
        anything = ops.any(allowed, axis=1, keepdims=True)
        allowed = allowed | ops.logical_not(anything)
        return ops.where(allowed, log_probs, IMPOSSIBLE)

    def _copy_probabilities(self, log_probs, copy, moves, kinds, vocabulary):
        """`(R, V)` log-probabilities where the copied id stands for "a word comes here".

        The word is the source's, so the search weighs only whether a word
        comes next: a word's first id takes the model's probability of any
        word (every id that is no bracket, tag or end of sequence, and the id
        itself); the ids that continue it are certain (log-probability 0).
        Otherwise a word the model spells differently (a rare one) would lose
        to brackets opened again and again.
        """
        wordlike = ((kinds == _OTHER) & (vocabulary != self.eos_id)) | copy
        any_word = ops.logsumexp(ops.where(wordlike, log_probs, IMPOSSIBLE), axis=1)  # (R,)
        starting = moves["between"][:, None]  # a word's first id, else one continuing it
        return ops.where(copy, ops.where(starting, any_word[:, None], 0.0), log_probs)

    def _copying(self, source_ids, starts, content):
        """Where each row stands in its source's words, with `copy_words`.

        The tokens between brackets are the source's ids with a tag after each
        word: source id `j` is the `j + w`-th of them, `w` the words before it.

        Returns:
            dict of `(R,)` tensors: `left` (words without their tag),
            `remaining` (words' ids and tags still to write), `between`
            (a bracket may come: no word is half written), `tag` (only a tag
            may come), `piece` (the source id `next` may come).
        """
        real = ops.cumsum(ops.cast(source_ids == self.eos_id, "int32"), axis=1) == 0  # (R, S)
        first = ops.arange(ops.shape(source_ids)[1]) == 0  # a source begins a word
        starts = (starts | first[None]) & real
        word_of = ops.cumsum(ops.cast(starts, "int32"), axis=1) - 1  # (R, S)
        slot = ops.arange(ops.shape(source_ids)[1], dtype="int32")[None] + word_of  # (R, S)
        words = ops.sum(ops.cast(starts, "int32"), axis=1)
        total = ops.sum(ops.cast(real, "int32"), axis=1) + words  # (R,)
        match = real & (slot == content[:, None])  # (R, S): the id written next, if any
        is_piece = ops.any(match, axis=1)
        is_start = ops.any(match & starts, axis=1)
        copied = ops.sum(ops.cast(real & (slot < content[:, None]), "int32"), axis=1)
        done = content >= total
        return {
            "left": words - (content - copied),
            "remaining": ops.maximum(total - content, 0),
            "between": is_start | done,
            "tag": ops.logical_not(is_piece | done),
            "piece": is_piece,
            "next": ops.sum(ops.where(match, source_ids, 0), axis=1),
        }
