import warnings

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import MultiHeadAttention
from tests.test_case import run_layer_test, to_numpy

B, T, S, D, H = 2, 4, 6, 8, 2


def numpy_attention(layer, query, value, mask=None):
    """Eq. (1) with the multi-head projections of section 3.2.2, in NumPy."""
    weights = {w.path.split("/", 1)[1]: to_numpy(w) for w in layer.weights}
    heads = []
    for h in range(layer.num_heads):
        q = query @ weights["query/kernel"][:, h] + weights["query/bias"][h]  # (B, T, K)
        k = value @ weights["key/kernel"][:, h] + weights["key/bias"][h]  # (B, S, K)
        v = value @ weights["value/kernel"][:, h] + weights["value/bias"][h]  # (B, S, K)
        logits = q @ k.transpose(0, 2, 1) / np.sqrt(layer.key_dim)  # (B, T, S)
        if mask is not None:
            logits = np.where(mask, logits, -np.inf)
        logits = logits - logits.max(-1, keepdims=True)
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        heads.append(probs @ v)  # (B, T, K)
    concat = np.concatenate(heads, axis=-1)  # (B, T, H*K)
    w_o = weights["attention_output/kernel"].reshape(concat.shape[-1], -1)  # (H*K, D)
    return concat @ w_o + weights["attention_output/bias"]


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    return (
        rng.normal(size=(B, T, D)).astype("float32"),
        rng.normal(size=(B, S, D)).astype("float32"),
    )


def test_layer_basics(data):
    query, value = data
    run_layer_test(
        MultiHeadAttention,
        init_kwargs={"num_heads": H, "key_dim": 4, "dropout": 0.1},
        input_data={"query": query, "value": value},
        expected_output_shape=(B, T, D),
        expected_num_trainable_weights=8,
    )


def test_matches_numpy_eq_1(data):
    query, value = data
    layer = MultiHeadAttention(num_heads=H, key_dim=3, bias_initializer="random_normal")
    outputs = to_numpy(layer(query, value))
    np.testing.assert_allclose(outputs, numpy_attention(layer, query, value), atol=1e-5)


def test_matches_numpy_with_mask(data):
    query, value = data
    mask = np.random.default_rng(1).random((B, T, S)) > 0.3
    mask[:, :, 0] = True  # every query attends at least one key
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    outputs = to_numpy(layer(query, value, attention_mask=mask))
    np.testing.assert_allclose(outputs, numpy_attention(layer, query, value, mask), atol=1e-5)


@pytest.mark.parametrize("masking", ["none", "padding", "causal", "explicit"])
def test_fused_kernel_equals_step_by_step_attention(data, masking):
    # Asking for the probabilities makes the layer attend step by step; without
    # them it calls the fused kernel. Both must compute the same function,
    # padded queries (fully masked rows) included.
    query, value = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4, bias_initializer="random_normal")
    kwargs = {}
    if masking == "padding":
        kwargs = {"query_mask": np.arange(T) < [[3], [2]], "value_mask": np.arange(S) < [[5], [1]]}
    elif masking == "explicit":
        kwargs = {"attention_mask": np.random.default_rng(2).random((B, T, S)) > 0.5}
    elif masking == "causal":
        value, kwargs = query, {"use_causal_mask": True, "query_mask": np.arange(T) < [[3], [4]]}
    fused = to_numpy(layer(query, value, **kwargs))
    step_by_step, _ = layer(query, value, return_attention_scores=True, **kwargs)
    np.testing.assert_allclose(fused, to_numpy(step_by_step), atol=1e-5)


@pytest.mark.parametrize(
    "init_kwargs, call_kwargs, expected",
    [
        ({}, {"training": True}, True),
        ({"dropout": 0.1}, {"training": False}, True),
        ({"dropout": 0.1}, {"training": True}, False),
        ({}, {"return_attention_scores": True}, False),
        ({"value_dim": 3}, {}, False),
    ],
)
def test_fused_kernel_is_used_where_it_computes_the_same(
    data, monkeypatch, init_kwargs, call_kwargs, expected
):
    calls = []
    fused = ops.dot_product_attention
    monkeypatch.setattr(
        ops, "dot_product_attention", lambda *a, **k: calls.append(1) or fused(*a, **k)
    )
    query, value = data
    MultiHeadAttention(num_heads=H, key_dim=4, **init_kwargs)(query, value, **call_kwargs)
    # TensorFlow has no fused kernel: the step-by-step path is faster there.
    assert bool(calls) == (expected and keras.backend.backend() != "tensorflow")


def test_attention_scores_are_probabilities(data):
    query, value = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    _, scores = layer(query, value, return_attention_scores=True)
    scores = to_numpy(scores)
    assert scores.shape == (B, H, T, S)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)


def test_keras_mask_equals_explicit_mask():
    ids = np.array([[3, 5, 7, 0, 0], [4, 0, 0, 0, 0]])
    embedding = keras.layers.Embedding(10, D, mask_zero=True)
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    inputs = keras.Input((5,), dtype="int32")
    states = embedding(inputs)
    model = keras.Model(inputs, layer(states, states))
    implicit = to_numpy(model(ids))

    real = ids != 0
    explicit_mask = real[:, :, None] & real[:, None, :]
    states = embedding(ids)
    explicit = to_numpy(layer(states, states, attention_mask=explicit_mask))
    np.testing.assert_array_equal(implicit, explicit)
    # The mask matters: without it the real positions change.
    bare_states = ops.convert_to_tensor(to_numpy(states))  # no Keras mask attached
    unmasked = to_numpy(layer(bare_states, bare_states))
    assert not np.allclose(unmasked[real], explicit[real])


def test_padded_keys_do_not_change_outputs(data):
    query, value = data
    value_mask = np.ones((B, S), bool)
    value_mask[:, -2:] = False
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    outputs = to_numpy(layer(query, value, value_mask=value_mask))
    changed = value.copy()
    changed[:, -2:] = 100.0
    np.testing.assert_allclose(
        to_numpy(layer(query, changed, value_mask=value_mask)), outputs, atol=1e-6
    )


def test_causal_mask_hides_the_future(data):
    query, _ = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    outputs = to_numpy(layer(query, query, use_causal_mask=True))
    changed = query.copy()
    changed[:, -1] += 5.0
    new_outputs = to_numpy(layer(changed, changed, use_causal_mask=True))
    np.testing.assert_allclose(new_outputs[:, :-1], outputs[:, :-1], atol=1e-6)
    assert not np.allclose(new_outputs[:, -1], outputs[:, -1])


@pytest.mark.parametrize("growing", [True, False])
def test_cached_self_attention_equals_full_pass(data, growing):
    query, _ = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    full = to_numpy(layer(query, query, use_causal_mask=True))
    length = 0 if growing else T
    cache = (ops.zeros((B, H, length, 4)), ops.zeros((B, H, length, 4)))
    steps = []
    for index in range(T):
        step = query[:, index : index + 1]
        output, cache = layer.call_with_cache(
            step, cache, None if growing else index, use_causal_mask=True
        )
        steps.append(to_numpy(output))
        assert tuple(cache[0].shape) == (B, H, index + 1 if growing else T, 4)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_fixed_size_cache_takes_several_steps_at_once(data):
    query, _ = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4, value_dim=3)
    full = to_numpy(layer(query, query, use_causal_mask=True))
    cache = (ops.zeros((B, H, T, 4)), ops.zeros((B, H, T, 3)))
    first, cache = layer.call_with_cache(query[:, :2], cache, 0, use_causal_mask=True)
    rest, cache = layer.call_with_cache(query[:, 2:], cache, 2, use_causal_mask=True)
    np.testing.assert_allclose(
        np.concatenate([to_numpy(first), to_numpy(rest)], 1), full, atol=1e-5
    )


def test_a_fixed_size_cache_masks_its_unwritten_slots_without_a_causal_mask(data):
    query, _ = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    expected = to_numpy(layer(query[:, :2], query[:, :2]))  # two keys, no mask
    # A buffer of T slots holding garbage past the two written ones.
    cache = (ops.ones((B, H, T, 4)) * 9.0, ops.ones((B, H, T, 4)) * 9.0)
    output, _ = layer.call_with_cache(query[:, :2], cache, 0)
    np.testing.assert_allclose(to_numpy(output), expected, atol=1e-5)


def test_a_growing_cache_takes_several_steps_at_once(data):
    query, _ = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    full = to_numpy(layer(query, query, use_causal_mask=True))
    cache = (ops.zeros((B, H, 0, 4)), ops.zeros((B, H, 0, 4)))
    first, cache = layer.call_with_cache(query[:, :3], cache, use_causal_mask=True)
    rest, cache = layer.call_with_cache(query[:, 3:], cache, use_causal_mask=True)
    assert tuple(cache[0].shape) == (B, H, T, 4)
    np.testing.assert_allclose(
        np.concatenate([to_numpy(first), to_numpy(rest)], 1), full, atol=1e-5
    )


def test_sublayers_are_public_and_hold_the_weights(data):
    query, value = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4, value_dim=3)
    layer(query, value)
    projections = (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)
    assert [tuple(p.kernel.shape) for p in projections] == [
        (D, H, 4),
        (D, H, 4),
        (D, H, 3),
        (H, 3, D),
    ]
    weights = {id(w) for p in projections for w in p.weights}
    assert weights == {id(w) for w in layer.weights}
    with pytest.raises(AttributeError):
        layer.query_dense = None


def test_a_first_step_attends_its_single_key_without_a_warning(data):
    query, _ = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    full = to_numpy(layer(query[:, :1], query[:, :1]))
    cache = (ops.zeros((B, H, 0, 4)), ops.zeros((B, H, 0, 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        output, _ = layer.call_with_cache(query[:, :1], cache, use_causal_mask=True)
    np.testing.assert_allclose(to_numpy(output), full, atol=1e-6)


def test_cross_attention_cache_equals_recomputation(data):
    query, value = data
    mask = np.ones((B, 1, S), bool)
    mask[1, :, -3:] = False
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    expected = to_numpy(layer(query, value, attention_mask=mask))
    cache = layer.compute_cache(value)
    assert [tuple(part.shape) for part in cache] == [(B, H, S, 4)] * 2
    output, scores = layer.attend_cached(
        query, cache, attention_mask=mask, return_attention_scores=True
    )
    np.testing.assert_allclose(to_numpy(output), expected, atol=1e-6)
    _, expected_scores = layer(query, value, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected_scores), atol=1e-6)


def test_one_query_attention_matches_numpy_with_a_mask(data):
    # A decoding step attends one query at a time with a softmax of its own
    # (element-wise ops, not the backend's kernel); eq. (1) in NumPy checks
    # it, with logits large enough to overflow exp() unless shifted by the max.
    query, value = data
    mask = np.ones((B, 1, S), bool)
    mask[1, :, -3:] = False
    layer = MultiHeadAttention(num_heads=H, key_dim=4, bias_initializer="random_normal")
    layer(query, value)  # builds it
    cache = layer.compute_cache(value)
    for index in range(T):
        step = query[:, index : index + 1] * 40.0  # (B, 1, D)
        output, scores = layer.attend_cached(
            step, cache, attention_mask=mask, return_attention_scores=True
        )
        expected = numpy_attention(layer, step, value, mask)
        np.testing.assert_allclose(to_numpy(output), expected, rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(to_numpy(scores).sum(-1), 1.0, atol=1e-6)
        assert (to_numpy(scores)[1, :, :, -3:] == 0).all()


def test_dropout_reaches_attention_probabilities(data):
    query, value = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4, dropout=0.99)
    inference = to_numpy(layer(query, value, training=False))
    np.testing.assert_array_equal(inference, to_numpy(layer(query, value)))
    assert not np.allclose(to_numpy(layer(query, value, training=True)), inference)


def test_fully_masked_rows_stay_finite(data):
    query, value = data
    mask = np.zeros((B, T, S), bool)
    layer = MultiHeadAttention(num_heads=H, key_dim=4)
    outputs = to_numpy(layer(query, value, attention_mask=mask))
    assert np.isfinite(outputs).all()


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_softmax_is_float32_under_mixed_precision(data, policy):
    query, value = data
    layer = MultiHeadAttention(num_heads=H, key_dim=4, dtype=policy)
    # Logits beyond float16's range (65504) must not overflow the softmax.
    outputs, scores = layer(query * 300.0, value * 300.0, return_attention_scores=True)
    assert np.isfinite(to_numpy(ops.cast(outputs, "float32"))).all()
    np.testing.assert_allclose(to_numpy(ops.cast(scores, "float32")).sum(-1), 1.0, atol=1e-2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_heads": 0, "key_dim": 4}, "num_heads=0"),
        ({"num_heads": 2, "key_dim": -1}, "key_dim=-1"),
        ({"num_heads": 2, "key_dim": 4, "dropout": 1.5}, "dropout=1.5"),
    ],
)
def test_invalid_arguments_name_the_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)


def test_projection_biases_are_drawn_independently():
    """A random bias initializer gives the query, key and value biases their own values."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4, bias_initializer="random_normal")
    layer.build((2, 3, 8), (2, 3, 8))
    biases = [to_numpy(getattr(layer, f"_{name}_dense").bias) for name in ("query", "key", "value")]
    for i in range(3):
        for j in range(i + 1, 3):
            assert not np.allclose(biases[i], biases[j])
