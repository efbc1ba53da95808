"""BracketConstraint: the allowed tokens against a stack-based reference, and searches under it."""

import keras
import numpy as np
import pytest

from keras_transformer import Transformer, beam_search, greedy_search
from keras_transformer.decoding import IMPOSSIBLE, BracketConstraint, score_hypotheses
from tests.test_case import to_numpy

PAD, EOS, VOCABULARY = 0, 3, 16
BRACKETS = {4: 6, 5: 7}  # (A -> )A, (B -> )B
LEAVES = (8, 9)
WORD_STARTS = (10, 11, 12)  # 13-15 continue a word
SOURCES = np.array(
    [[10, 13, 11, 12, EOS, PAD], [12, 14, 15, EOS, PAD, PAD], [10, 11, 12, 10, 11, EOS]], "int32"
)
WORDS = [3, 1, 5]


def constraint():
    return BracketConstraint(VOCABULARY, BRACKETS, LEAVES, WORD_STARTS, EOS)


def reference_allowed(history, words, room):
    """The allowed next tokens, from a stack of open brackets walked token by token."""
    stack, leaves = [], 0  # stack: [opening id, leaves under it]
    for token in history:
        if token in BRACKETS:
            stack.append([token, 0])
        elif token in BRACKETS.values():
            stack.pop()
        elif token in LEAVES:
            leaves += 1
            for entry in stack:
                entry[1] += 1
    left, depth = words - leaves, len(stack)
    allowed = set()
    if left > 0 and room >= left + depth + 3:
        allowed |= set(BRACKETS)
    if left > 0 and depth > 0 and room >= left + depth + 1:
        allowed |= set(LEAVES)
    if stack and stack[-1][1] > 0 and (depth > 1 or left == 0) and room >= left + depth:
        allowed.add(BRACKETS[stack[-1][0]])
    if depth == 0 and left == 0 and leaves > 0:
        allowed.add(EOS)
    return allowed or set(range(VOCABULARY))


def random_prefixes(rng, count, width, words, limit):
    """Prefixes a constrained search could write: random walks over the reference's choices."""
    prefixes = []
    for _ in range(count):
        length = int(rng.integers(0, width))
        history = []
        for index in range(length):
            allowed = sorted(reference_allowed(history, words, limit - index) - {EOS})
            if not allowed:
                break
            history.append(int(rng.choice(allowed)))
        prefixes.append(history)
    return prefixes


@pytest.mark.parametrize("limit", [20, 9])
def test_allowed_tokens_match_a_stack_walk(limit):
    rng = np.random.default_rng(0)
    width, source = 16, SOURCES[2:3]  # five words
    prefixes = random_prefixes(rng, 40, width, WORDS[2], limit)
    for index in range(width):
        at = [p for p in prefixes if len(p) == index]
        if not at:
            continue
        history = np.array([p + [PAD] * (width - index) for p in at], "int32")
        log_probs = constraint()(
            keras.ops.zeros((len(at), VOCABULARY)),
            history,
            index,
            np.repeat(source, len(at), axis=0),
            np.full((len(at),), limit, "int32"),
        )
        allowed = to_numpy(log_probs) > IMPOSSIBLE / 2
        for row, prefix in enumerate(at):
            expected = reference_allowed(prefix, WORDS[2], limit - index)
            assert set(np.flatnonzero(allowed[row])) == expected, prefix


def test_a_limit_too_short_for_the_words_leaves_the_row_free():
    log_probs = constraint()(
        keras.ops.zeros((1, VOCABULARY)),
        np.zeros((1, 4), "int32"),
        0,
        SOURCES[2:3],
        np.array([4], "int32"),  # five words need at least eight tokens
    )
    assert np.all(to_numpy(log_probs) == 0.0)


@pytest.fixture(scope="module")
def model():
    model = Transformer(
        vocabulary_size=VOCABULARY,
        num_layers=1,
        hidden_dim=16,
        intermediate_dim=32,
        num_heads=2,
        dropout=0.0,
    )
    model((SOURCES, SOURCES))
    rng = np.random.default_rng(3)
    for weight in model.weights:
        if not weight.path.endswith(("gamma", "beta")):
            weight.assign(rng.normal(0.0, 0.3, weight.shape).astype("float32"))
    return model


def check_well_formed(tokens, words):
    """`tokens` (T,) is one bracketing with `words` leaves, then EOS and padding."""
    tokens = list(tokens)
    assert EOS in tokens, tokens
    end = tokens.index(EOS)
    assert all(token == PAD for token in tokens[end + 1 :])
    stack, leaves = [], 0
    for position, token in enumerate(tokens[:end]):
        if token in BRACKETS:
            stack.append(token)
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
