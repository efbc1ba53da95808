import keras_hub
import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import Decoder, DecoderLayer
from tests.test_case import run_layer_test, to_numpy

B, T, S, D, H, L = 2, 4, 5, 8, 2, 2


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    encoder_padding_mask = np.ones((B, S), bool)
    encoder_padding_mask[1, 2:] = False
    return (
        rng.normal(size=(B, T, D)).astype("float32"),
        rng.normal(size=(B, S, D)).astype("float32"),
        encoder_padding_mask,
    )


def test_layer_basics(data):
    target, source, _ = data
    run_layer_test(
        DecoderLayer,
        init_kwargs={"num_heads": H, "intermediate_dim": 16},
        input_data={"inputs": target, "encoder_outputs": source},
        expected_output_shape=(B, T, D),
        expected_num_trainable_weights=26,
    )


@pytest.mark.parametrize("argument", ["dropout", "attention_dropout", "activation_dropout"])
def test_dropout_reaches_sublayers(data, argument):
    target, source, _ = data
    layer = DecoderLayer(num_heads=H, intermediate_dim=16, **{"dropout": 0.0, argument: 0.99})
    inference = to_numpy(layer(target, source))
    assert not np.allclose(to_numpy(layer(target, source, training=True)), inference)
    np.testing.assert_array_equal(to_numpy(layer(target, source)), inference)


def test_stack_basics(data):
    target, source, _ = data
    run_layer_test(
        Decoder,
        init_kwargs={
            "num_layers": L,
            "num_heads": H,
            "intermediate_dim": 16,
            "attention_dropout": 0.1,
            "activation_dropout": 0.2,
        },
        input_data={"inputs": target, "encoder_outputs": source},
        expected_output_shape=(B, T, D),
        expected_num_trainable_weights=52,
    )


@pytest.mark.parametrize("normalize_first", [False, True])
def test_matches_keras_hub_decoder(data, normalize_first):
    target, source, encoder_padding_mask = data
    ours = DecoderLayer(
        num_heads=H,
        intermediate_dim=16,
        layer_norm_epsilon=1e-5,
        normalize_first=normalize_first,
        bias_initializer="random_normal",
    )
    reference = keras_hub.layers.TransformerDecoder(
        intermediate_dim=16, num_heads=H, normalize_first=normalize_first
    )
    outputs = to_numpy(ours(target, source, encoder_padding_mask=encoder_padding_mask))
    reference(target, source, encoder_padding_mask=encoder_padding_mask)
    reference.set_weights(ours.get_weights())
    expected = to_numpy(reference(target, source, encoder_padding_mask=encoder_padding_mask))
    np.testing.assert_allclose(outputs, expected, atol=1e-5)


def test_future_targets_and_padded_sources_do_not_leak(data):
    target, source, encoder_padding_mask = data
    decoder = Decoder(num_layers=L, num_heads=H, intermediate_dim=16)
    outputs = to_numpy(decoder(target, source, encoder_padding_mask=encoder_padding_mask))
    changed_target = target.copy()
    changed_target[:, -1] += 10.0
    changed_source = source.copy()
    changed_source[~encoder_padding_mask] = 50.0
    new_outputs = to_numpy(
        decoder(changed_target, changed_source, encoder_padding_mask=encoder_padding_mask)
    )
    np.testing.assert_allclose(new_outputs[:, :-1], outputs[:, :-1], atol=1e-5)
    assert not np.allclose(new_outputs[:, -1], outputs[:, -1])


@pytest.mark.parametrize("growing", [True, False])
@pytest.mark.parametrize("normalize_first", [False, True])
def test_cached_decoding_equals_full_pass(data, normalize_first, growing):
    target, source, encoder_padding_mask = data
    decoder = Decoder(
        num_layers=L, num_heads=H, intermediate_dim=16, normalize_first=normalize_first
    )
    full = to_numpy(decoder(target, source, encoder_padding_mask=encoder_padding_mask))
    self_cache = decoder.initial_cache(B, 0 if growing else T)
    cross_cache = decoder.compute_cross_attention_cache(source)
    assert [tuple(k.shape) + tuple(v.shape) for k, v in self_cache] == [
        (B, H, 0 if growing else T, D // H) * 2
    ] * L
    assert [tuple(k.shape) + tuple(v.shape) for k, v in cross_cache] == [(B, H, S, D // H) * 2] * L
    # One position, then two at once (a forced prefix), then one.
    steps = []
    for start, end in [(0, 1), (1, 3), (3, T)]:
        output, self_cache = decoder.call_with_cache(
            target[:, start:end],
            self_cache,
            cross_cache,
            encoder_padding_mask=encoder_padding_mask,
            cache_update_index=None if growing else start,
        )
        steps.append(to_numpy(output))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_call_with_cache_needs_a_built_decoder_and_a_cache_pair_per_layer(data):
    target, source, encoder_padding_mask = data
    decoder = Decoder(num_layers=L, num_heads=H, intermediate_dim=16)
    with pytest.raises(ValueError, match="needs a built Decoder"):
        decoder.call_with_cache(target[:, :1], [], [])
    decoder(target, source)
    self_cache = decoder.initial_cache(B)
    cross_cache = decoder.compute_cross_attention_cache(source)
    with pytest.raises(
        ValueError,
        match="one .keys, values. pair per layer .2.. Received: 2 self-attention and 1 cross",
    ):
        decoder.call_with_cache(target[:, :1], self_cache, cross_cache[:1])


def test_returns_cross_attention_scores(data):
    target, source, encoder_padding_mask = data
    decoder = Decoder(num_layers=L, num_heads=H, intermediate_dim=16)
    outputs, scores = decoder(
        target, source, encoder_padding_mask=encoder_padding_mask, return_attention_scores=True
    )
    scores = to_numpy(scores)
    assert scores.shape == (B, L, H, T, S)
    np.testing.assert_allclose(scores.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(scores[1, ..., 2:], 0.0)
    # Without scores attention runs as one fused kernel: same function, other rounding.
    np.testing.assert_allclose(
        to_numpy(outputs),
        to_numpy(decoder(target, source, encoder_padding_mask=encoder_padding_mask)),
        atol=1e-5,
    )


def test_keras_masks_equal_explicit_masks():
    import keras

    target_ids = np.array([[2, 5, 7, 0], [2, 6, 0, 0]])
    source_ids = np.array([[3, 5, 7, 8, 0], [4, 6, 0, 0, 0]])
    embedding = keras.layers.Embedding(10, D, mask_zero=True)
    decoder = Decoder(num_layers=L, num_heads=H, intermediate_dim=16)
    target_in = keras.Input((4,), dtype="int32")
    source_in = keras.Input((5,), dtype="int32")
    model = keras.Model([target_in, source_in], decoder(embedding(target_in), embedding(source_in)))
    implicit = to_numpy(model([target_ids, source_ids]))
    explicit = to_numpy(
        decoder(
            ops.convert_to_tensor(to_numpy(embedding(target_ids))),
            ops.convert_to_tensor(to_numpy(embedding(source_ids))),
            decoder_padding_mask=target_ids != 0,
            encoder_padding_mask=source_ids != 0,
        )
    )
    np.testing.assert_array_equal(implicit, explicit)
