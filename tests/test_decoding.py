"""Greedy and beam search: equivalences, scores, length limits and padding."""

import keras
import numpy as np
import pytest

from keras_transformer import Transformer, beam_search, greedy_search, length_penalty
from keras_transformer.decoding import score_hypotheses
from tests.test_case import random_transformer, to_numpy

PAD, EOS, VOCABULARY = 0, 3, 16
EXTRA = 8  # extra target tokens over the source length; 50 in the paper, short here
# Three sources of different lengths, padded to 6.
SOURCES = np.array(
    [[5, 6, 7, 8, 9, EOS], [4, 5, EOS, PAD, PAD, PAD], [9, 8, 7, EOS, PAD, PAD]], "int32"
)


@pytest.fixture(scope="module")
def model():
    # With this seed beam search ends most hypotheses with EOS and some at their length limit.
    return random_transformer(SOURCES, VOCABULARY, num_layers=2, seed=2)


def numpy_length_penalty(length, alpha):
    return ((5.0 + length) / 6.0) ** alpha


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_length_penalty_is_the_gnmt_formula(alpha):
    lengths = np.array([1, 2, 7, 50])
    np.testing.assert_allclose(
        to_numpy(length_penalty(lengths, alpha)), numpy_length_penalty(lengths, alpha), rtol=1e-6
    )


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_the_power_form_is_length_to_the_alpha(alpha):
    lengths = np.array([1, 2, 7, 50])
    power = to_numpy(length_penalty(lengths, alpha, "power"))
    np.testing.assert_allclose(power, lengths.astype("float64") ** alpha, rtol=1e-6)
    # A graph's form, as its offset: 5 is GNMT's, 0 the power.
    for offset, expected in ((5.0, numpy_length_penalty(lengths, alpha)), (0.0, power)):
        chosen = length_penalty(lengths, alpha, keras.ops.convert_to_tensor(offset))
        np.testing.assert_allclose(to_numpy(chosen), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="penalty_form must be one of"):
        length_penalty(lengths, alpha, "gnmt2")


def test_beam_scores_follow_the_power_form(model):
    tokens, scores = beam_search(
        model, SOURCES, alpha=1.0, num_hypotheses=4, extra_length=EXTRA, penalty_form="power"
    )
    tokens, scores = to_numpy(tokens), to_numpy(scores)
    for rank in range(4):
        _, token_log_probs = score_hypotheses(
            model, SOURCES, tokens[:, rank], return_token_log_probs=True
        )
        lengths = (tokens[:, rank] != PAD).sum(axis=1)
        expected = to_numpy(token_log_probs).sum(axis=1) / lengths  # log p / |Y| ** 1
        np.testing.assert_allclose(scores[:, rank], expected, rtol=1e-4)
    assert np.all(np.diff(scores, axis=1) <= 0)
    # The forms rank differently here: alpha 1 favours long hypotheses more under the power.
    gnmt, _ = beam_search(model, SOURCES, alpha=1.0, num_hypotheses=4, extra_length=EXTRA)
    assert not np.array_equal(to_numpy(gnmt), tokens)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_end_at_limit_forces_the_end_token_scored_zero(model, beam_size):
    limit = 3  # shorter than the model's own endings
    free = to_numpy(beam_search(model, SOURCES, beam_size=beam_size, max_output_length=limit)[0])
    assert np.all(free[:, 0, -1] != EOS)  # every best hypothesis is cut by the limit
    tokens, scores = beam_search(
        model, SOURCES, beam_size=beam_size, max_output_length=limit, end_at_limit=True,
        num_hypotheses=beam_size, alpha=0.6, penalty_form="power",
    )  # fmt: skip
    tokens, scores = to_numpy(tokens), to_numpy(scores)
    assert np.all(tokens[..., -1] == EOS)
    _, token_log_probs = score_hypotheses(model, SOURCES, tokens[:, 0], return_token_log_probs=True)
    # The forced end adds 0: the score is the first limit - 1 tokens' log-probability.
    expected = to_numpy(token_log_probs)[:, : limit - 1].sum(axis=1) / limit**0.6
    np.testing.assert_allclose(scores[:, 0], expected, rtol=1e-4)
    if beam_size == 1:
        greedy, greedy_scores = greedy_search(
            model, SOURCES, max_output_length=limit, end_at_limit=True, return_scores=True,
            alpha=0.6, penalty_form="power",
        )  # fmt: skip
        np.testing.assert_array_equal(to_numpy(greedy), tokens[:, 0])
        np.testing.assert_allclose(to_numpy(greedy_scores), scores[:, 0], rtol=1e-5)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_size_one_is_greedy(model, alpha):
    greedy, greedy_scores = greedy_search(
        model, SOURCES, alpha=alpha, extra_length=EXTRA, return_scores=True
    )
    beam, beam_scores = beam_search(model, SOURCES, beam_size=1, alpha=alpha, extra_length=EXTRA)
    np.testing.assert_array_equal(to_numpy(beam)[:, 0], to_numpy(greedy))
    np.testing.assert_allclose(to_numpy(beam_scores)[:, 0], to_numpy(greedy_scores), rtol=1e-5)


def test_cached_greedy_equals_recomputed_prefix(model):
    cached, cached_scores = greedy_search(model, SOURCES, extra_length=EXTRA, return_scores=True)
    uncached, uncached_scores = greedy_search(
        model, SOURCES, extra_length=EXTRA, use_cache=False, return_scores=True
    )
    np.testing.assert_array_equal(to_numpy(cached), to_numpy(uncached))
    np.testing.assert_allclose(to_numpy(cached_scores), to_numpy(uncached_scores), rtol=1e-4)


def test_cached_beam_equals_recomputed_prefix(model):
    cached, cached_scores = beam_search(model, SOURCES, num_hypotheses=4, extra_length=EXTRA)
    uncached, uncached_scores = beam_search(
        model, SOURCES, num_hypotheses=4, extra_length=EXTRA, use_cache=False
    )
    np.testing.assert_array_equal(to_numpy(cached), to_numpy(uncached))
    np.testing.assert_allclose(to_numpy(cached_scores), to_numpy(uncached_scores), rtol=1e-4)


def test_beam_scores_are_the_models_length_normalized_log_probabilities(model):
    tokens, scores = beam_search(
        model, SOURCES, beam_size=4, alpha=0.6, num_hypotheses=4, extra_length=EXTRA
    )
    tokens, scores = to_numpy(tokens), to_numpy(scores)
    for rank in range(4):
        rescored = to_numpy(score_hypotheses(model, SOURCES, tokens[:, rank], alpha=0.6))
        np.testing.assert_allclose(scores[:, rank], rescored, rtol=1e-4)
    # Best first, and no hypothesis twice.
    assert np.all(np.diff(scores, axis=1) <= 0)
    for row in tokens:
        assert len({tuple(hypothesis) for hypothesis in row}) == 4


def test_every_hypothesis_ends_with_eos_then_padding_or_at_its_limit(model):
    tokens, _ = beam_search(model, SOURCES, num_hypotheses=4, extra_length=EXTRA)
    source_lengths = (SOURCES != PAD).sum(axis=1)
    for sentence, hypotheses in enumerate(to_numpy(tokens)):
        limit = source_lengths[sentence] + EXTRA
        for hypothesis in hypotheses:
            produced = int((hypothesis != PAD).sum())
            assert produced <= limit
            assert np.all(hypothesis[produced:] == PAD)
            eos_positions = np.flatnonzero(hypothesis == EOS)
            if produced < limit:  # ended by EOS, not by the limit
                assert list(eos_positions) == [produced - 1]
    ended = (to_numpy(tokens) == EOS).any(axis=-1)
    assert ended.any() and not ended.all(), "the check needs both kinds of ending"


@pytest.mark.parametrize("decode", ["greedy", "beam"])
def test_padding_in_the_batch_changes_no_result(model, decode):
    def run(sources):
        if decode == "greedy":
            return to_numpy(greedy_search(model, sources, extra_length=EXTRA))[:, None]
        return to_numpy(beam_search(model, sources, num_hypotheses=2, extra_length=EXTRA)[0])

    batched = run(np.pad(SOURCES, [(0, 0), (0, 4)]))
    for row, source in enumerate(SOURCES):
        alone = run(source[source != PAD][None])
        width = min(alone.shape[-1], batched.shape[-1])
        np.testing.assert_array_equal(batched[row, :, :width], alone[0, :, :width])
        assert np.all(batched[row, :, width:] == PAD) and np.all(alone[0, :, width:] == PAD)


def test_rows_of_a_large_batch_decode_as_they_do_alone(model):
    """24 sentences: rows that finish early stay in the batch for some steps
    (greedy drops them only once a sixteenth have finished) and beam search
    gathers its hypotheses' rows among many; neither changes a row's result."""
    rng = np.random.default_rng(7)
    sources = np.full((24, 6), PAD, "int32")
    for row, length in enumerate(rng.integers(1, 6, size=24)):
        sources[row, :length] = rng.integers(4, VOCABULARY, size=length)
        sources[row, length] = EOS
    greedy, scores = greedy_search(model, sources, extra_length=EXTRA, return_scores=True)
    beams = beam_search(model, sources, num_hypotheses=2, extra_length=EXTRA)[0]
    lengths = np.sum(to_numpy(greedy) != PAD, axis=1)  # an EOS or the row's length limit
    # The first row to finish finishes alone, so it stays in the batch (masked) for some steps.
    assert np.sum(lengths == lengths.min()) == 1 and len(set(lengths)) > 3
    for row, source in enumerate(sources):
        alone = source[source != PAD][None]
        tokens, score = greedy_search(model, alone, extra_length=EXTRA, return_scores=True)
        width = to_numpy(tokens).shape[1]
        np.testing.assert_array_equal(to_numpy(greedy)[row, :width], to_numpy(tokens)[0])
        assert np.all(to_numpy(greedy)[row, width:] == PAD)
        np.testing.assert_allclose(to_numpy(scores)[row], to_numpy(score)[0], rtol=1e-5)
        if row % 4 == 0:  # beam search alone on a sample of the rows, to keep the test short
            alone_beams = beam_search(model, alone, num_hypotheses=2, extra_length=EXTRA)[0]
            np.testing.assert_array_equal(to_numpy(beams)[row, :, :width], to_numpy(alone_beams)[0])


def test_bad_arguments_are_named(model):
    with pytest.raises(ValueError, match="beam_size=0"):
        beam_search(model, SOURCES, beam_size=0)
    with pytest.raises(ValueError, match="num_hypotheses=5"):
        beam_search(model, SOURCES, beam_size=4, num_hypotheses=5)


class BigramModel:
    """A stand-in model whose next-token logits depend only on the previous token.

    It implements the decoding interface the searches call, so a search can be
    checked against probabilities chosen by hand.
    """

    pad_id, bos_id, eos_id = PAD, 2, EOS

    def __init__(self, probabilities):
        self.table = np.log(np.asarray(probabilities, "float32") + 1e-12)  # (V, V)

    def padding_mask(self, ids):
        return keras.ops.not_equal(ids, PAD)

    def start_decoding(self, source_ids, cache_length=0):
        rows = keras.ops.shape(source_ids)[0]
        return {"source": {"rows": keras.ops.zeros((rows,))}, "target": {}}

    def decoding_step(self, token_ids, state, index=None):
        logits = keras.ops.take(self.table, token_ids, axis=0)  # (R, V)
        return keras.ops.log_softmax(logits, axis=-1), state


def test_unlikely_early_endings_do_not_end_the_search():
    """Ending is the second choice at every step but never a likely one.

    Tokens: 0 pad, 1 unk, 2 bos, 3 eos, 4 a, 5 b. After bos or a: a 0.95,
    eos 0.04, b 0.01. The best hypothesis is "a" repeated to the length limit.
    A beam of 2 sees two unlikely endings before that; stopping as soon as
    two hypotheses have ended would return one of them.
    """
    row = [0.0, 0.0, 0.0, 0.04, 0.95, 0.01]
    model = BigramModel([row, row, row, [0, 0, 0, 0.5, 0, 0.5], row, [0, 0, 0, 0.5, 0, 0.5]])
    source = np.array([[4]], "int32")  # length 1: at most 1 + 5 target tokens
    greedy, greedy_score = greedy_search(
        model, source, extra_length=5, alpha=0.6, return_scores=True
    )
    for beam_size in (1, 2, 4):
        tokens, scores = beam_search(model, source, beam_size=beam_size, extra_length=5)
        np.testing.assert_array_equal(to_numpy(tokens)[0, 0], [4] * 6)
        np.testing.assert_allclose(to_numpy(scores)[0, 0], to_numpy(greedy_score)[0], rtol=1e-5)
    np.testing.assert_array_equal(to_numpy(greedy)[0], [4] * 6)


@pytest.mark.parametrize("beam_size", [2, 4])
def test_beam_finds_hypotheses_at_least_as_likely_as_greedy(model, beam_size):
    greedy = greedy_search(model, SOURCES, extra_length=EXTRA)
    greedy_scores = to_numpy(score_hypotheses(model, SOURCES, greedy, alpha=0.6))
    _, scores = beam_search(model, SOURCES, beam_size=beam_size, extra_length=EXTRA)
    assert np.all(to_numpy(scores)[:, 0] >= greedy_scores - 1e-5)


def test_token_log_probs_are_the_cached_decoders_step_by_step(model):
    greedy = to_numpy(greedy_search(model, SOURCES, extra_length=EXTRA))  # (B, T)
    scores, tokens = score_hypotheses(model, SOURCES, greedy, return_token_log_probs=True)
    scores, tokens = to_numpy(scores), to_numpy(tokens)
    # The same tokens fed one at a time through the key/value cache.
    width = greedy.shape[1]
    state = model.start_decoding(SOURCES, width)
    previous = np.full((len(SOURCES),), model.bos_id, "int32")
    for index in range(width):
        log_probs, state = model.decoding_step(previous, state, index)
        picked = np.take_along_axis(to_numpy(log_probs), greedy[:, index : index + 1], 1)[:, 0]
        expected = np.where(greedy[:, index] != PAD, picked, 0.0)
        np.testing.assert_allclose(tokens[:, index], expected, rtol=1e-4, atol=1e-5)
        previous = greedy[:, index]
    np.testing.assert_allclose(tokens.sum(axis=1), scores, rtol=1e-5)
    assert np.all(tokens[greedy == PAD] == 0.0) and np.all(tokens[greedy != PAD] < 0)


def test_decoders_compile_in_a_graph(model):
    """jax.jit (static shapes) and tf.function over unknown batch and length."""
    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        compile_ = jax.jit
    elif backend == "tensorflow":
        import tensorflow as tf

        def compile_(function):
            return tf.function(function, input_signature=[tf.TensorSpec([None, None], "int32")])
    else:
        pytest.skip(f"no graph compilation check for {backend}")

    def beam(sources):
        return beam_search(model, sources, num_hypotheses=2, extra_length=EXTRA)

    def greedy(sources):
        return greedy_search(model, sources, extra_length=EXTRA, return_scores=True)

    for decode in (beam, greedy):
        compiled = compile_(decode)(SOURCES)
        eager = decode(SOURCES)
        np.testing.assert_array_equal(to_numpy(compiled[0]), to_numpy(eager[0]))
        np.testing.assert_allclose(to_numpy(compiled[1]), to_numpy(eager[1]), rtol=1e-5)


@pytest.mark.parametrize("static_shapes", [True, False])
@pytest.mark.parametrize("use_cache", [True, False])
def test_static_and_dynamic_shapes_give_the_same_results(model, static_shapes, use_cache):
    """Fixed-size caches with finished rows kept vs growing caches with rows dropped."""
    if keras.backend.backend() == "jax" and not static_shapes:
        with pytest.raises(ValueError, match="static_shapes=False"):
            greedy_search(model, SOURCES, static_shapes=False)
        return
    expected = beam_search(model, SOURCES, num_hypotheses=3, extra_length=EXTRA)
    tokens, scores = beam_search(
        model,
        SOURCES,
        num_hypotheses=3,
        extra_length=EXTRA,
        use_cache=use_cache,
        static_shapes=static_shapes,
    )
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(expected[0]))
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected[1]), rtol=1e-4)
    greedy = greedy_search(model, SOURCES, extra_length=EXTRA, return_scores=True)
    tokens, scores = greedy_search(
        model,
        SOURCES,
        extra_length=EXTRA,
        use_cache=use_cache,
        return_scores=True,
        static_shapes=static_shapes,
    )
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(greedy[0]))
    np.testing.assert_allclose(to_numpy(scores), to_numpy(greedy[1]), rtol=1e-4)


def test_early_stop_ends_a_sentence_when_its_best_extension_ends():
    """After bos: eos 0.6, a 0.4; after a: a 0.99. The best extension ends at
    once; the default rule goes on while the live "a a a ..." scores better
    under the length penalty than the finished "eos"."""
    row_bos = [0.0, 0.0, 0.0, 0.6, 0.4, 0.0]
    row_a = [0.0, 0.0, 0.0, 0.01, 0.99, 0.0]
    model = BigramModel([row_bos, row_bos, row_bos, row_bos, row_a, row_a])
    source = np.array([[4, 4]], "int32")
    early, early_scores = beam_search(
        model, source, beam_size=2, alpha=1.0, extra_length=5, early_stop=True
    )
    full, full_scores = beam_search(model, source, beam_size=2, alpha=1.0, extra_length=5)
    np.testing.assert_array_equal(to_numpy(early)[0, 0, :1], [EOS])
    assert to_numpy(full)[0, 0, 0] == 4  # the longer hypothesis wins under the length penalty
    assert to_numpy(full_scores)[0, 0] > to_numpy(early_scores)[0, 0]


@pytest.mark.parametrize("size, k", [(8000, 8), (1000, 3), (70, 8), (5, 4)])
def test_blockwise_top_k_equals_a_full_sort(size, k):
    from keras_transformer.decoding.beam import _top_k

    values = np.random.default_rng(size).normal(size=(6, size)).astype("float32")
    top, indices = _top_k(keras.ops.convert_to_tensor(values), k)
    expected = np.argsort(-values, axis=1)[:, :k]
    np.testing.assert_array_equal(to_numpy(indices), expected)
    np.testing.assert_array_equal(to_numpy(top), np.take_along_axis(values, expected, axis=1))


@pytest.mark.parametrize("policy", ["mixed_bfloat16", "mixed_float16"])
@pytest.mark.parametrize("static_shapes", [True, False])
def test_mixed_precision_models_decode_with_caches(model, policy, static_shapes):
    """The cached step runs outside `__call__`; its caches keep the compute dtype."""
    if keras.backend.backend() == "jax" and not static_shapes:
        return
    mixed = Transformer.from_config({**model.get_config(), "dtype": policy})
    mixed((SOURCES, SOURCES))
    mixed.set_weights(model.get_weights())
    state = mixed.start_decoding(SOURCES, 4 if static_shapes else 0)
    ids = keras.ops.full((3,), mixed.bos_id, dtype="int32")
    log_probs, state = mixed.decoding_step(ids, state, 0 if static_shapes else None)
    cache = state["target"]["self_attention_cache"]
    assert {keras.backend.standardize_dtype(part.dtype) for pair in cache for part in pair} == {
        policy.split("_")[1]
    }
    options = {"extra_length": EXTRA, "static_shapes": static_shapes}
    tokens = greedy_search(mixed, SOURCES, **options)
    best, _ = beam_search(mixed, SOURCES, beam_size=2, **options)
    assert tuple(tokens.shape) == (3, 6 + EXTRA) and tuple(best.shape)[:2] == (3, 1)
    # Rounding in half precision may change a close choice, not most of them.
    expected = to_numpy(greedy_search(model, SOURCES, **options))
    assert np.mean(to_numpy(tokens) == expected) > 0.8
