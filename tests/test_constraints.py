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


# Copying words: 8 and 9 are tags and also begin words (as `▁CD` begins `CDs`).
COPY_STARTS = (8, 9, 10, 11, 12)
COPY_SOURCES = np.array(
    [[8, 13, 11, 9, EOS, PAD], [12, 14, 15, EOS, PAD, PAD], [10, 9, 8, 14, 11, EOS]], "int32"
)
# A source that begins inside a word (its first id begins one all the same), and ids
# after the end of sequence, which are not the source's.
ODD_SOURCES = np.array([[13, 10, 14, EOS, 11, 12]], "int32")


def copying(max_depth=None):
    return BracketConstraint(
        VOCABULARY, BRACKETS, LEAVES, COPY_STARTS, EOS, max_depth, copy_words=True
    )


def slots(source):
    """What each leaf of a copying parse writes: a source word's ids, then a tag (None)."""
    ids = [int(i) for i in source[: list(source).index(EOS)]]
    out = []
    for position, token in enumerate(ids):
        if position > 0 and token in COPY_STARTS:
            out.append(None)
        out.append(token)
    return tuple(out + [None])


def copy_legal(slots_, stack, at, token, max_depth):
    """Whether `token` may follow when `at` of `slots_` are written, the length aside."""
    done = at == len(slots_)
    next_slot = None if done else slots_[at]
    between = done or at == 0 or slots_[at - 1] is None
    if token == EOS:
        return done and not stack and at > 0
    if not between:
        return token == next_slot if next_slot is not None else token in LEAVES
    if token in BRACKETS:
        return not done and (max_depth is None or len(stack) < max_depth)
    if token in BRACKETS.values():
        return (
            bool(stack)
            and BRACKETS[stack[-1][0]] == token
            and stack[-1][1]
            and (len(stack) > 1 or done)
        )
    return not done and bool(stack) and token == next_slot


def copy_step(slots_, stack, at, token):
    if token in BRACKETS:
        return stack + ((token, False),), at
    if token in BRACKETS.values():
        return stack[:-1], at
    return tuple((label, True) for label, _ in stack), at + 1


def copy_finishes(slots_, stack, at, room, max_depth):
    """Whether some legal continuation of at most `room` tokens ends the tree (brute force)."""
    # Labels do not change what can follow (each has its closing bracket): one label will do.
    return _copy_finishes(slots_, tuple((4, filled) for _, filled in stack), at, room, max_depth)


@functools.cache
def _copy_finishes(slots_, stack, at, room, max_depth):
    if room < 1:
        return False
    candidates = {4, 6, 8, EOS} | ({slots_[at]} if at < len(slots_) else set()) - {None}
    return any(
        copy_legal(slots_, stack, at, token, max_depth)
        and (
            token == EOS
            or _copy_finishes(slots_, *copy_step(slots_, stack, at, token), room - 1, max_depth)
        )
        for token in candidates
    )


@pytest.mark.parametrize(
    "sentence, limit, max_depth",
    [(0, 20, None), (0, 11, None), (2, 20, None), (2, 14, 2), (1, 7, 1), (3, 14, None), (3, 9, 1)],
)
def test_copying_allows_what_can_still_end_as_a_tree_over_the_copied_words(
    sentence, limit, max_depth
):
    rng = np.random.default_rng(1)
    width = 16
    source = np.concatenate([COPY_SOURCES, ODD_SOURCES])[sentence : sentence + 1]
    slots_ = slots(source[0])
    prefixes = []
    for _ in range(150):
        history, stack, at = [], (), 0
        for _ in range(int(rng.integers(0, width))):
            legal_next = [
                t
                for t in range(VOCABULARY)
                if t != EOS and copy_legal(slots_, stack, at, t, max_depth)
            ]
            if not legal_next:
                break
            token = int(rng.choice(legal_next))
            history.append(token)
            stack, at = copy_step(slots_, stack, at, token)
        prefixes.append((history, stack, at))
    checked = 0
    for index in range(width):
        at_index = [p for p in prefixes if len(p[0]) == index]
        if not at_index:
            continue
        junk = rng.choice([*BRACKETS, *LEAVES, 13], (len(at_index), width - index))
        history = np.array([p[0] + list(row) for p, row in zip(at_index, junk, strict=True)])
        log_probs = copying(max_depth)(
            keras.ops.zeros((len(at_index), VOCABULARY)),
            history.astype("int32"),
            index,
            np.repeat(source, len(at_index), axis=0),
            np.full((len(at_index),), limit, "int32"),
        )
        allowed = to_numpy(log_probs) > IMPOSSIBLE / 2
        for row, (prefix, stack, at) in enumerate(at_index):
            room = limit - index
            expected = {
                token
                for token in range(VOCABULARY)
                if copy_legal(slots_, stack, at, token, max_depth)
                and (
                    token == EOS
                    or copy_finishes(
                        slots_, *copy_step(slots_, stack, at, token), room - 1, max_depth
                    )
                )
            } or set(range(VOCABULARY))
            assert set(np.flatnonzero(allowed[row])) == expected, prefix
            checked += 1
    assert checked > 100


def check_copied(tokens, source):
    """`tokens` is one bracketing whose leaves are the source's words, each then a tag."""
    tokens = list(tokens)
    end = tokens.index(EOS)
    between = [t for t in tokens[:end] if t not in BRACKETS and t not in BRACKETS.values()]
    expected = slots(source)
    assert len(between) == len(expected), tokens
    for written, slot in zip(between, expected, strict=True):
        assert written in LEAVES if slot is None else written == slot, tokens
    stack = []
    for token in tokens[:end]:
        if token in BRACKETS:
            stack.append(token)
        elif token in BRACKETS.values():
            assert stack and BRACKETS[stack.pop()] == token, tokens
        else:
            assert stack, tokens
    assert not stack, tokens


def test_searches_copy_the_source_words_into_trees(model):
    greedy = to_numpy(greedy_search(model, COPY_SOURCES, extra_length=16, constraint=copying()))
    beams, _ = beam_search(
        model, COPY_SOURCES, beam_size=3, num_hypotheses=3, extra_length=16, constraint=copying()
    )
    for row, sentence, source in zip(greedy, to_numpy(beams), COPY_SOURCES, strict=True):
        check_copied(row, source)
        for hypothesis in sentence:
            check_copied(hypothesis, source)


def test_copying_weighs_where_a_word_goes_not_how_it_is_spelt():
    rng = np.random.default_rng(2)
    log_probs = np.log(rng.dirichlet(np.ones(VOCABULARY), size=2)).astype("float32")
    source = np.array([[10, 13, EOS], [10, 13, EOS]], "int32")
    history = np.array([[4, PAD, PAD], [4, 10, PAD]], "int32")  # (A | (A w-
    out = to_numpy(copying()(log_probs, history, 1, source, np.array([20, 20], "int32")))
    # After `(A`: the word's first id carries the probability of any word there.
    words = [i for i in range(VOCABULARY) if i not in (4, 5, 6, 7, 8, 9, EOS)]
    np.testing.assert_allclose(out[0, 10], np.logaddexp.reduce(log_probs[0, words]), rtol=1e-5)
    np.testing.assert_allclose(out[0, [4, 5]], log_probs[0, [4, 5]])  # brackets as they were
    assert (out[0, [6, 7, 8, 9, 11, 13, EOS]] <= IMPOSSIBLE / 2).all()
    # Inside the word its next id is certain, and nothing else may come.
    out = to_numpy(copying()(log_probs, history, 2, source, np.array([20, 20], "int32")))
    assert out[1, 13] == 0.0 and (np.delete(out[1], 13) <= IMPOSSIBLE / 2).all()
