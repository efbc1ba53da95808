"""BracketConstraint: the allowed tokens against a brute-force search, and searches under it."""

import functools

import keras
import numpy as np
import pytest

from keras_transformer import beam_search, greedy_search
from keras_transformer.decoding import IMPOSSIBLE, BracketConstraint, score_hypotheses
from tests.test_case import random_transformer, to_numpy

PAD, EOS, VOCABULARY = 0, 3, 16
BRACKETS = {4: 6, 5: 7}  # (A -> )A, (B -> )B
LEAVES = (8, 9)
WORD_STARTS = (10, 11, 12)  # 13-15 continue a word
SOURCES = np.array(
    [[10, 13, 11, 12, EOS, PAD], [12, 14, 15, EOS, PAD, PAD], [10, 11, 12, 10, 11, EOS]], "int32"
)
WORDS = [3, 1, 5]


def constraint(max_depth=None):
    return BracketConstraint(VOCABULARY, BRACKETS, LEAVES, WORD_STARTS, EOS, max_depth)


def walk(history, words):
    """The grammar's state after `history`: (open brackets with whether each holds a
    leaf, words left, whether the root has closed)."""
    stack, left, closed = (), words, False
    for token in history:
        stack, left, closed = move((stack, left, closed), token)
    return stack, left, closed


def move(state, token):
    stack, left, closed = state
    if token in BRACKETS:
        return stack + ((token, False),), left, closed
    if token in BRACKETS.values():
        return stack[:-1], left, not stack[:-1]
    return tuple((label, True) for label, _ in stack), left - 1, closed  # a leaf


def legal(state, token, max_depth):
    """Whether `token` may follow in a tree over the words, the length aside."""
    stack, left, closed = state
    if token == EOS:
        return closed and left == 0
    if closed:
        return False
    if token in BRACKETS:
        return left > 0 and (max_depth is None or len(stack) < max_depth)
    if token in LEAVES:
        return left > 0 and bool(stack)
    if token in BRACKETS.values():
        return (
            bool(stack)
            and BRACKETS[stack[-1][0]] == token
            and stack[-1][1]
            and (len(stack) > 1 or left == 0)
        )
    return False


def finishes(state, room, max_depth):
    """Whether some legal continuation of at most `room` tokens ends the tree (brute force)."""
    stack, left, closed = state
    # Labels do not change what can follow (each has its closing bracket): one label will do.
    return _finishes((tuple((4, filled) for _, filled in stack), left, closed), room, max_depth)


@functools.cache
def _finishes(state, room, max_depth):
    if room < 1:
        return False
    return any(
        legal(state, token, max_depth)
        and (token == EOS or _finishes(move(state, token), room - 1, max_depth))
        for token in (4, 6, 8, EOS)  # open, close, leaf, end: one of each kind
    )


def expected_allowed(history, words, room, max_depth=None):
    """The legal next tokens from which the tree can still end within `room` tokens."""
    state = walk(history, words)
    allowed = {
        token
        for token in range(VOCABULARY)
        if legal(state, token, max_depth)
        and (token == EOS or finishes(move(state, token), room - 1, max_depth))
    }
    return allowed or set(range(VOCABULARY))


def random_prefixes(rng, count, width, words, max_depth):
    """Random grammatical prefixes, the length limit ignored: some can still end within it,
    some cannot (as after a forced prefix), so every rule is met at every room."""
    prefixes = []
    for _ in range(count):
        history = []
        for _ in range(int(rng.integers(0, width))):
            state = walk(history, words)
            legal_next = [t for t in range(VOCABULARY) if t != EOS and legal(state, t, max_depth)]
            if not legal_next:
                break
            history.append(int(rng.choice(legal_next)))
        prefixes.append(history)
    return prefixes


@pytest.mark.parametrize(
    "sentence, limit, max_depth", [(2, 20, None), (2, 9, None), (2, 8, None), (0, 12, 2), (1, 6, 1)]
)
def test_allowed_tokens_are_those_from_which_a_tree_can_still_end(sentence, limit, max_depth):
    rng = np.random.default_rng(0)
    width, source = 16, SOURCES[sentence : sentence + 1]
    words = WORDS[sentence]
    prefixes = random_prefixes(rng, 120, width, words, max_depth)
    for index in range(width):
        at = [p for p in prefixes if len(p) == index]
        if not at:
            continue
        # Positions from `index` on hold leftovers, which the constraint must ignore.
        junk = rng.choice([*BRACKETS, *BRACKETS.values(), *LEAVES], (len(at), width - index))
        history = np.array([p + list(row) for p, row in zip(at, junk, strict=True)], "int32")
        log_probs = constraint(max_depth)(
            keras.ops.zeros((len(at), VOCABULARY)),
            history,
            index,
            np.repeat(source, len(at), axis=0),
            np.full((len(at),), limit, "int32"),
        )
        allowed = to_numpy(log_probs) > IMPOSSIBLE / 2
        for row, prefix in enumerate(at):
            expected = expected_allowed(prefix, words, limit - index, max_depth)
            assert set(np.flatnonzero(allowed[row])) == expected, prefix


@pytest.fixture(scope="module")
def model():
    return random_transformer(SOURCES, VOCABULARY, num_layers=1, seed=3)


def check_well_formed(tokens, words, max_depth=None):
    """`tokens` (T,) is one bracketing with `words` leaves, then EOS and padding."""
    tokens = list(tokens)
    assert EOS in tokens, tokens
    end = tokens.index(EOS)
    assert all(token == PAD for token in tokens[end + 1 :])
    stack, leaves = [], 0
    for position, token in enumerate(tokens[:end]):
        if token in BRACKETS:
            stack.append(token)
            assert max_depth is None or len(stack) <= max_depth, tokens
        elif token in BRACKETS.values():
            assert stack and BRACKETS[stack.pop()] == token, tokens
            assert stack or position == end - 1, tokens  # the root closes last
        else:
            assert token in LEAVES and stack, tokens
            leaves += 1
    assert not stack and leaves == words, tokens


@pytest.mark.parametrize("static_shapes", [None, True])
def test_greedy_outputs_are_trees_over_the_words_scored_by_the_model(model, static_shapes):
    if static_shapes is None and keras.backend.backend() == "jax":
        pytest.skip("JAX always decodes with static shapes")
    tokens, scores = greedy_search(
        model,
        SOURCES,
        extra_length=12,
        return_scores=True,
        static_shapes=static_shapes,
        constraint=constraint(),
    )
    for row, words in zip(to_numpy(tokens), WORDS, strict=True):
        check_well_formed(row, words)
    # The constraint removes choices, not probability: scores are the model's.
    expected = score_hypotheses(model, SOURCES, tokens)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected), rtol=1e-4, atol=1e-4)


def test_beam_outputs_are_trees_and_beam_one_is_constrained_greedy(model):
    tokens, scores = beam_search(
        model, SOURCES, beam_size=4, num_hypotheses=3, extra_length=12, constraint=constraint()
    )
    for sentence, words in zip(to_numpy(tokens), WORDS, strict=True):
        for hypothesis in sentence:
            check_well_formed(hypothesis, words)
    best = to_numpy(score_hypotheses(model, SOURCES, tokens[:, 0], alpha=0.6))
    np.testing.assert_allclose(to_numpy(scores)[:, 0], best, rtol=1e-4, atol=1e-4)
    greedy = greedy_search(model, SOURCES, extra_length=12, constraint=constraint())
    one = beam_search(model, SOURCES, beam_size=1, extra_length=12, constraint=constraint())[0]
    np.testing.assert_array_equal(to_numpy(one)[:, 0], to_numpy(greedy))


def test_unconstrained_search_writes_something_else(model):
    """The test model is not a parser: without the constraint its outputs are not trees."""
    tokens = to_numpy(greedy_search(model, SOURCES, extra_length=12))
    with pytest.raises(AssertionError):
        for row, words in zip(tokens, WORDS, strict=True):
            check_well_formed(row, words)


def test_prefixes_are_forced_and_the_constraint_takes_over_after_them(model):
    prefix = np.array([[4, 8, PAD], [5, 4, 9], [4, 5, PAD]], "int32")  # (A tag; (B (A tag; ...
    tokens = greedy_search(
        model, SOURCES, extra_length=12, target_prefix=prefix, constraint=constraint()
    )
    for row, start, words in zip(to_numpy(tokens), prefix, WORDS, strict=True):
        start = [token for token in start if token != PAD]
        assert list(row[: len(start)]) == start
        check_well_formed(row, words)


def test_the_depth_limit_holds(model):
    tokens, _ = beam_search(
        model, SOURCES, beam_size=3, num_hypotheses=3, extra_length=12, constraint=constraint(1)
    )
    for sentence, words in zip(to_numpy(tokens), WORDS, strict=True):
        for hypothesis in sentence:
            check_well_formed(hypothesis, words, max_depth=1)
