import keras
import keras_hub
import numpy as np
import pytest

from keras_transformer.layers import Encoder, EncoderLayer
from tests.test_case import run_layer_test, to_numpy

B, S, D = 2, 5, 8


@pytest.fixture
def inputs():
    return np.random.default_rng(0).normal(size=(B, S, D)).astype("float32")


@pytest.fixture
def padding_mask():
    mask = np.ones((B, S), bool)
    mask[1, 3:] = False
    return mask


@pytest.mark.parametrize("normalize_first", [False, True])
def test_layer_basics(inputs, normalize_first):
    run_layer_test(
        EncoderLayer,
        init_kwargs={"num_heads": 2, "intermediate_dim": 16, "normalize_first": normalize_first},
        input_data={"inputs": inputs},
        expected_output_shape=(B, S, D),
        expected_num_trainable_weights=16,
    )


@pytest.mark.parametrize("normalize_first, weights", [(False, 32), (True, 34)])
def test_stack_basics(inputs, normalize_first, weights):
    run_layer_test(
        Encoder,
        init_kwargs={
            "num_layers": 2,
            "num_heads": 2,
            "intermediate_dim": 16,
            "normalize_first": normalize_first,
            "activation_dropout": 0.2,
        },
        input_data={"inputs": inputs},
        expected_output_shape=(B, S, D),
        expected_num_trainable_weights=weights,
    )


# keras-hub's names for our sublayers; its weights come in another order.
KERAS_HUB_NAMES = {
    "self_attention_layer/": "self_attention/",
    "self_attention_layer_norm/": "self_attention_norm/",
    "feedforward_layer_norm/": "feed_forward_norm/",
    "feedforward_intermediate_dense/": "feed_forward/intermediate/",
    "feedforward_output_dense/": "feed_forward/output/",
}


def copy_weights_to_keras_hub(ours, reference):
    by_path = {w.path.split("/", 1)[1]: w for w in ours.weights}
    for weight in reference.weights:
        path = weight.path.split("/", 1)[1]
        for theirs, mine in KERAS_HUB_NAMES.items():
            if path.startswith(theirs):
                path = mine + path[len(theirs) :]
                break
        weight.assign(by_path.pop(path))
    assert not by_path, f"weights left unmatched: {sorted(by_path)}"


@pytest.mark.parametrize("normalize_first", [False, True])
def test_matches_keras_hub_encoder(inputs, padding_mask, normalize_first):
    ours = EncoderLayer(
        num_heads=2,
        intermediate_dim=16,
        layer_norm_epsilon=1e-5,
        normalize_first=normalize_first,
        bias_initializer="random_normal",
    )
    reference = keras_hub.layers.TransformerEncoder(
        intermediate_dim=16, num_heads=2, normalize_first=normalize_first
    )
    ours_out = to_numpy(ours(inputs, padding_mask=padding_mask))
    reference(inputs, padding_mask=padding_mask)
    copy_weights_to_keras_hub(ours, reference)
    expected = to_numpy(reference(inputs, padding_mask=padding_mask))
    # keras-hub masks padded keys only; we also mask padded queries, so compare real tokens.
    np.testing.assert_allclose(ours_out[padding_mask], expected[padding_mask], atol=1e-5)


def test_post_norm_output_is_normalized(inputs):
    outputs = to_numpy(EncoderLayer(num_heads=2, intermediate_dim=16)(inputs))
    np.testing.assert_allclose(outputs.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(outputs.std(-1), 1.0, atol=1e-3)
    pre_norm = to_numpy(
        EncoderLayer(num_heads=2, intermediate_dim=16, normalize_first=True)(inputs)
    )
    assert not np.allclose(pre_norm.std(-1), 1.0, atol=1e-2)


def test_padded_positions_do_not_change_real_outputs(inputs, padding_mask):
    encoder = Encoder(num_layers=2, num_heads=2, intermediate_dim=16)
    outputs = to_numpy(encoder(inputs, padding_mask=padding_mask))
    changed = inputs.copy()
    changed[~padding_mask] = 50.0
    new_outputs = to_numpy(encoder(changed, padding_mask=padding_mask))
    np.testing.assert_allclose(new_outputs[padding_mask], outputs[padding_mask], atol=1e-5)
    unmasked = to_numpy(encoder(changed))
    assert not np.allclose(unmasked[padding_mask], outputs[padding_mask], atol=1e-3)


def test_keras_mask_equals_explicit_padding_mask():
    ids = np.array([[3, 5, 7, 2, 0], [4, 6, 0, 0, 0]])
    embedding = keras.layers.Embedding(10, D, mask_zero=True)
    encoder = Encoder(num_layers=2, num_heads=2, intermediate_dim=16)
    inputs = keras.Input((5,), dtype="int32")
    implicit = to_numpy(keras.Model(inputs, encoder(embedding(inputs)))(ids))
    states = keras.ops.convert_to_tensor(to_numpy(embedding(ids)))
    explicit = to_numpy(encoder(states, padding_mask=ids != 0))
    np.testing.assert_array_equal(implicit, explicit)


@pytest.mark.parametrize("argument", ["dropout", "attention_dropout", "activation_dropout"])
def test_dropout_reaches_sublayers(inputs, argument):
    layer = EncoderLayer(num_heads=2, intermediate_dim=16, **{"dropout": 0.0, argument: 0.99})
    assert not np.allclose(to_numpy(layer(inputs, training=True)), to_numpy(layer(inputs)))


def test_invalid_arguments(inputs):
    with pytest.raises(ValueError, match="num_heads=3"):
        EncoderLayer(num_heads=3, intermediate_dim=16)(inputs)
    with pytest.raises(ValueError, match="num_layers=0"):
        Encoder(num_layers=0, num_heads=2, intermediate_dim=16)
    with pytest.raises(ValueError, match="dropout=1.0"):
        EncoderLayer(num_heads=2, intermediate_dim=16, dropout=1.0)
