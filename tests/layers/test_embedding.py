import math

import keras
import numpy as np
import pytest

from keras_transformer.layers import TokenEmbedding
from tests.test_case import run_layer_test, to_numpy

IDS = np.array([[3, 1, 4, 0], [5, 9, 0, 0]], "int32")


def test_layer_basics():
    run_layer_test(
        TokenEmbedding,
        init_kwargs={"vocabulary_size": 10, "hidden_dim": 8, "pad_id": 0},
        input_data={"inputs": IDS},
        expected_output_shape=(2, 4, 8),
        expected_num_trainable_weights=1,
    )


def test_reverse_layer_basics():
    run_layer_test(
        TokenEmbedding,
        init_kwargs={"vocabulary_size": 10, "hidden_dim": 8},
        input_data={"inputs": np.ones((2, 4, 8), "float32")},
        call_kwargs={"reverse": True},
        expected_output_shape=(2, 4, 10),
        expected_num_trainable_weights=1,
    )


def test_embeddings_are_scaled_by_sqrt_d():
    layer = TokenEmbedding(10, 16)
    outputs = to_numpy(layer(IDS))
    table = to_numpy(layer.embeddings)
    np.testing.assert_allclose(outputs, table[IDS] * math.sqrt(16), rtol=1e-6)
    unscaled = TokenEmbedding(10, 16, scale=False)
    np.testing.assert_allclose(to_numpy(unscaled(IDS)), to_numpy(unscaled.embeddings)[IDS])


def test_reverse_is_the_transposed_matrix():
    layer = TokenEmbedding(10, 16)
    layer.build()
    states = np.random.default_rng(0).normal(size=(2, 3, 16)).astype("float32")
    logits = to_numpy(layer(states, reverse=True))
    np.testing.assert_allclose(logits, states @ to_numpy(layer.embeddings).T, rtol=1e-5, atol=1e-5)


def test_pad_id_makes_a_keras_mask():
    inputs = keras.Input((4,), dtype="int32")
    outputs = TokenEmbedding(10, 8, pad_id=0)(inputs)
    model = keras.Model(inputs, outputs)
    assert outputs._keras_mask is not None
    layer = model.layers[-1]
    np.testing.assert_array_equal(to_numpy(layer.compute_mask(IDS)), IDS != 0)


def test_invalid_arguments():
    with pytest.raises(ValueError, match="pad_id=12"):
        TokenEmbedding(10, 8, pad_id=12)
    with pytest.raises(ValueError, match="vocabulary_size=0"):
        TokenEmbedding(0, 8)


def test_int8_embeddings_are_kerass_abs_max_scheme_and_round_trip(tmp_path):
    """One scale a token, 127 / max |row|; lookups and logits use q / scale in float."""
    layer = TokenEmbedding(10, 16, pad_id=0)
    layer.build()
    table = to_numpy(layer.embeddings)
    states = np.random.default_rng(0).normal(size=(2, 3, 16)).astype("float32")
    layer.quantize("int8")
    assert layer.quantization_mode == "int8" and str(layer.embeddings.dtype) == "int8"
    scale = 127 / np.abs(table).max(axis=-1)
    q = np.clip(np.round(table * scale[:, None]), -127, 127)
    np.testing.assert_array_equal(to_numpy(layer.embeddings), q)
    dequantized = q / scale[:, None]
    assert 0 < np.abs(dequantized - table).max() <= 0.5 / scale.min()  # lossy, within half a step
    np.testing.assert_allclose(to_numpy(layer(IDS)), dequantized[IDS] * 4, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        to_numpy(layer(states, reverse=True)), states @ dequantized.T, rtol=1e-5, atol=1e-5
    )
    inputs = keras.Input((4,), dtype="int32")
    model = keras.Model(inputs, layer(inputs))
    model.save(tmp_path / "int8.keras")
    loaded = keras.saving.load_model(tmp_path / "int8.keras").layers[-1]
    assert loaded.quantization_mode == "int8" and str(loaded.embeddings.dtype) == "int8"
    np.testing.assert_array_equal(to_numpy(loaded(IDS)), to_numpy(layer(IDS)))
    with pytest.raises(ValueError, match="already quantized"):
        layer.quantize("int8")
    with pytest.raises(ValueError, match="int8 only. Received: mode=int4"):
        _quantize_built("int4")


def _quantize_built(mode):
    layer = TokenEmbedding(10, 16)
    layer.build()
    layer.quantize(mode)
