"""Sampling and target prefixes: against greedy search, the softmax, and decoding by hand."""

import keras
import numpy as np
import pytest

from keras_transformer import beam_search, greedy_search, sample
from keras_transformer.decoding import filter_log_probs
from tests.test_case import to_numpy
from tests.test_decoding import EXTRA, SOURCES, BigramModel, model  # noqa: F401  (fixture)

# Bigram stand-in: after BOS, tokens 4..7 with these probabilities (pad, unk,
# bos, eos never follow BOS); every token is followed by EOS.
FIRST = np.array([0.0, 0.0, 0.0, 0.0, 0.5, 0.3, 0.15, 0.05])


def bigram():
    table = np.zeros((8, 8))
    table[:, 3] = 1.0
    table[2] = FIRST
    return BigramModel(table)


def first_tokens(tokens):
    return to_numpy(tokens)[..., 0].reshape(-1)


def test_top_k_one_is_greedy_search(model):  # noqa: F811
    tokens, log_probs = sample(model, SOURCES, num_samples=3, top_k=1, extra_length=EXTRA, seed=3)
    greedy, scores = greedy_search(model, SOURCES, extra_length=EXTRA, return_scores=True)
    expected = np.repeat(to_numpy(greedy)[:, None], 3, axis=1)
    np.testing.assert_array_equal(to_numpy(tokens), expected)
    expected_scores = np.repeat(to_numpy(scores)[:, None], 3, axis=1)  # alpha 0: log-probabilities
    np.testing.assert_allclose(to_numpy(log_probs), expected_scores, rtol=1e-5)


def test_a_seed_repeats_its_samples_and_another_seed_differs(model):  # noqa: F811
    options = {"num_samples": 4, "temperature": 2.0, "extra_length": EXTRA}
    first, first_scores = sample(model, SOURCES, seed=7, **options)
    again, again_scores = sample(model, SOURCES, seed=7, **options)
    other, _ = sample(model, SOURCES, seed=8, **options)
    np.testing.assert_array_equal(to_numpy(first), to_numpy(again))
    np.testing.assert_array_equal(to_numpy(first_scores), to_numpy(again_scores))
    assert not np.array_equal(to_numpy(first), to_numpy(other))


@pytest.mark.parametrize("use_cache, static_shapes", [(False, None), (True, True), (True, False)])
def test_cached_uncached_static_and_dynamic_sampling_agree(model, use_cache, static_shapes):  # noqa: F811
    if keras.backend.backend() == "jax" and static_shapes is False:
        return
    options = {"num_samples": 3, "temperature": 1.5, "top_p": 0.9, "seed": 5}
    expected, expected_scores = sample(model, SOURCES, extra_length=EXTRA, **options)
    tokens, scores = sample(
        model, SOURCES, extra_length=EXTRA, use_cache=use_cache, static_shapes=static_shapes,
        **options,
    )  # fmt: skip
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(expected))
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected_scores), rtol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_first_token_frequencies_match_the_tempered_softmax(temperature):
    draws = 4000
    tokens, log_probs = sample(
        bigram(), np.array([[4, 3]]), num_samples=draws, temperature=temperature,
        max_output_length=2, seed=11,
    )  # fmt: skip
    counts = np.bincount(first_tokens(tokens), minlength=8) / draws
    weights = np.where(FIRST > 0, FIRST, 0.0) ** (1.0 / temperature)
    expected = weights / weights.sum()
    # Four standard errors of a frequency from 4,000 draws at most.
    np.testing.assert_allclose(counts, expected, atol=4 * np.sqrt(0.25 / draws))
    # The returned log-probabilities are the model's own, untempered.
    picked = first_tokens(tokens)
    np.testing.assert_allclose(to_numpy(log_probs)[0], np.log(FIRST[picked]), atol=1e-4)


@pytest.mark.parametrize("top_p, nucleus", [(0.5, {4}), (0.7, {4, 5}), (0.9, {4, 5, 6})])
def test_top_p_never_samples_outside_the_nucleus(top_p, nucleus):
    tokens, _ = sample(
        bigram(), np.array([[4, 3]]), num_samples=2000, top_p=top_p, max_output_length=2, seed=2
    )
    assert set(first_tokens(tokens)) == nucleus


def test_top_k_keeps_the_k_most_probable():
    tokens, _ = sample(
        bigram(), np.array([[4, 3]]), num_samples=2000, top_k=2, max_output_length=2, seed=4
    )
    assert set(first_tokens(tokens)) == {4, 5}


def test_filtering_keeps_the_order_and_cuts_what_it_must():
    log_probs = np.log(np.array([[0.1, 0.6, 0.3]], "float32"))
    kept = to_numpy(filter_log_probs(log_probs, top_p=0.8)) > -1e8
    np.testing.assert_array_equal(kept, [[False, True, True]])
    kept = to_numpy(filter_log_probs(log_probs, top_k=1)) > -1e8
    np.testing.assert_array_equal(kept, [[False, True, False]])


@pytest.mark.parametrize(
    "vocabulary, top_k",
    [
        (9, [0, 3, 0, 1, 4]),  # a vocabulary narrower than the partial sort: one full sort
        (100, [2, 3, 64, 1, 0]),  # every row that cuts keeps at most 64: a partial sort
        (100, [0, 3, 0, 70, 4]),  # nuclei over the whole vocabulary, a top 70: a full sort
    ],
)
def test_per_row_settings_filter_each_row_as_its_own_numbers_do(vocabulary, top_k):
    random = np.random.RandomState(vocabulary)
    log_probs = np.log(random.dirichlet(np.ones(vocabulary), size=5)).astype("float32")
    temperature = np.array([1.0, 0.5, 2.0, 1.0, 0.8], "float32")
    top_k = np.array(top_k, "int32")
    top_p = np.where(top_k == 0, [1.0, 1.0, 0.6, 0.9, 1.0], [1.0, 1.0, 0.6, 0.9, 0.5])
    top_p = top_p.astype("float32")
    rows = to_numpy(filter_log_probs(log_probs, temperature, top_k, top_p))
    for row in range(5):
        alone = filter_log_probs(
            log_probs[row : row + 1], float(temperature[row]), int(top_k[row]), float(top_p[row])
        )
        np.testing.assert_allclose(rows[row], to_numpy(alone)[0], rtol=1e-6)
    assert np.sum(rows > -1e8) < 5 * vocabulary  # something was cut
    untouched = filter_log_probs(log_probs, temperature, np.zeros(5, "int32"), np.ones(5))
    np.testing.assert_allclose(to_numpy(untouched), log_probs / temperature[:, None], rtol=1e-6)


def test_per_sentence_settings_and_uniforms_sample_each_sentence_as_alone(model):  # noqa: F811
    """What the SavedModel relies on: a sentence's samples depend on its own settings and draws."""
    samples, width = 3, SOURCES.shape[1] + EXTRA
    uniforms = np.random.RandomState(1).uniform(size=(3, samples, width)).astype("float32")
    temperature = np.array([1.5, 0.7, 1.0], "float32")
    top_k, top_p = np.array([0, 4, 2], "int32"), np.array([0.9, 1.0, 1.0], "float32")
    tokens, scores = sample(
        model, SOURCES, samples, temperature, top_k, top_p, extra_length=EXTRA, uniforms=uniforms
    )
    for row in range(3):
        alone, alone_scores = sample(
            model, SOURCES[row : row + 1], samples, float(temperature[row]), int(top_k[row]),
            float(top_p[row]), extra_length=EXTRA, uniforms=uniforms[row : row + 1],
        )  # fmt: skip
        np.testing.assert_array_equal(to_numpy(tokens)[row], to_numpy(alone)[0])
        np.testing.assert_allclose(to_numpy(scores)[row], to_numpy(alone_scores)[0], rtol=1e-5)
    other, _ = sample(
        model, SOURCES, samples, temperature, top_k, top_p, extra_length=EXTRA,
        uniforms=uniforms[:, ::-1],
    )  # fmt: skip
    assert not np.array_equal(to_numpy(other), to_numpy(tokens))


@pytest.mark.parametrize(
    "options, message",
    [
        ({"temperature": 0.0}, "temperature must be positive. Received: temperature=0.0"),
        ({"top_p": 0.0}, "top_p must be in \\(0, 1\\]. Received: top_p=0.0"),
        ({"top_p": 1.5}, "top_p=1.5"),
        ({"top_k": -1}, "top_k must be 0 \\(off\\) or positive. Received: top_k=-1"),
        ({"num_samples": 0}, "num_samples=0"),
    ],
)
def test_bad_sampling_arguments_are_named(options, message):
    with pytest.raises(ValueError, match=message):
        sample(bigram(), np.array([[4, 3]]), **options)


PREFIX = np.array([[7, 9, 0], [11, 0, 0], [5, 6, 8]], "int32")  # padded with 0


def search(name, model, **options):  # noqa: F811
    """`(B, N, T)` outputs of a search, so that the three compare alike."""
    if name == "greedy":
        return to_numpy(greedy_search(model, SOURCES, extra_length=EXTRA, **options))[:, None]
    if name == "beam":
        return to_numpy(
            beam_search(model, SOURCES, num_hypotheses=2, extra_length=EXTRA, **options)[0]
        )
    return to_numpy(sample(model, SOURCES, num_samples=2, extra_length=EXTRA, seed=1, **options)[0])


@pytest.mark.parametrize("name", ["greedy", "beam", "sample"])
def test_every_output_starts_with_its_prefix(model, name):  # noqa: F811
    outputs = search(name, model, target_prefix=PREFIX)
    for row, prefix in enumerate(PREFIX):
        prefix = prefix[prefix != 0]
        assert (outputs[row, :, : len(prefix)] == prefix).all()


@pytest.mark.parametrize("name", ["greedy", "beam", "sample"])
def test_an_empty_prefix_is_no_prefix(model, name):  # noqa: F811
    empty = np.zeros((3, 0), "int32")
    np.testing.assert_array_equal(search(name, model, target_prefix=empty), search(name, model))


def test_greedy_with_a_prefix_continues_from_the_cache_the_prefix_filled(model):  # noqa: F811
    source, prefix = SOURCES[:1], [7, 9]
    tokens, score = greedy_search(
        model, source, max_output_length=6, target_prefix=[prefix], return_scores=True
    )
    # By hand: feed BOS and the prefix, then take the most probable token.
    state = model.start_decoding(source)
    ids, total, expected = [model.bos_id, *prefix], 0.0, list(prefix)
    for position in range(6):
        log_probs, state = model.decoding_step(keras.ops.array([ids[position]]), state)
        log_probs = to_numpy(log_probs)[0]
        log_probs[[model.pad_id, model.bos_id]] = -np.inf
        if position < len(prefix):
            total += log_probs[prefix[position]]
            continue
        token = int(np.argmax(log_probs))
        total += log_probs[token]
        expected.append(token)
        ids.append(token)
        if token == model.eos_id:
            break
    np.testing.assert_array_equal(to_numpy(tokens)[0, : len(expected)], expected)
    np.testing.assert_allclose(to_numpy(score)[0], total, rtol=1e-4)


def teacher_forced_attention(model, tokens):  # noqa: F811
    """The last layer's encoder-decoder attention, averaged over heads, of a full pass."""
    bos = np.full((tokens.shape[0], 1), model.bos_id, "int32")
    inputs = np.concatenate([bos, tokens[:, :-1]], axis=1)  # (B, T)
    encoder_outputs, padding_mask = model.encode(SOURCES)
    _, scores = model.decode(inputs, encoder_outputs, padding_mask, return_attention_scores=True)
    return to_numpy(scores)[:, -1].mean(axis=1)  # (B, T, S)


def produced(tokens):
    """Bool `(B, T)`: the positions a search produced (up to and with EOS)."""
    ended = np.cumsum(tokens == 3, axis=1) - (tokens == 3)
    return (ended == 0) & (tokens != 0)


@pytest.mark.parametrize("use_cache", [True, False])
def test_greedy_alignments_are_the_teacher_forced_attention(model, use_cache):  # noqa: F811
    tokens, attention = greedy_search(
        model, SOURCES, extra_length=EXTRA, use_cache=use_cache, return_attention=True
    )
    tokens, attention = to_numpy(tokens), to_numpy(attention)
    assert attention.shape == tokens.shape + (SOURCES.shape[1],)
    real = produced(tokens)
    expected = teacher_forced_attention(model, tokens)
    np.testing.assert_allclose(attention[real], expected[real], atol=1e-5)
    # Each produced token's row sums to 1 over the real source positions.
    source_real = (SOURCES != 0)[:, None, :]
    np.testing.assert_allclose(attention.sum(-1)[real], 1.0, rtol=1e-5)
    assert np.all(np.where(source_real, 0.0, attention) == 0.0)
    assert np.all(attention[~real] == 0.0)


def test_sample_alignments_are_the_teacher_forced_attention(model):  # noqa: F811
    tokens, _, attention = sample(
        model, SOURCES, num_samples=2, seed=3, extra_length=EXTRA, return_attention=True
    )
    tokens, attention = to_numpy(tokens), to_numpy(attention)
    assert attention.shape == tokens.shape + (SOURCES.shape[1],)
    for draw in range(2):
        real = produced(tokens[:, draw])
        expected = teacher_forced_attention(model, tokens[:, draw])
        np.testing.assert_allclose(attention[:, draw][real], expected[real], atol=1e-5)


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_alignments_are_each_hypothesis_rescored(model, use_cache):  # noqa: F811
    tokens, _, attention = beam_search(
        model, SOURCES, num_hypotheses=3, extra_length=EXTRA, use_cache=use_cache,
        return_attention=True,
    )  # fmt: skip
    tokens, attention = to_numpy(tokens), to_numpy(attention)
    assert attention.shape == tokens.shape + (SOURCES.shape[1],)
    for rank in range(3):
        real = produced(tokens[:, rank])
        expected = teacher_forced_attention(model, tokens[:, rank])
        np.testing.assert_allclose(attention[:, rank][real], expected[real], atol=1e-5)
        np.testing.assert_allclose(attention[:, rank].sum(-1)[real], 1.0, rtol=1e-5)
    # Asking for alignments changes no hypothesis.
    plain, _ = beam_search(model, SOURCES, num_hypotheses=3, extra_length=EXTRA)
    np.testing.assert_array_equal(tokens, to_numpy(plain))
