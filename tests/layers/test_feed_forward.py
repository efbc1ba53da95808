import numpy as np
import pytest

from keras_transformer.layers import FeedForward
from tests.test_case import run_layer_test, to_numpy


def test_layer_basics():
    run_layer_test(
        FeedForward,
        init_kwargs={"intermediate_dim": 16, "dropout": 0.1},
        input_data={"inputs": np.ones((2, 3, 8), "float32")},
        expected_output_shape=(2, 3, 8),
        expected_num_trainable_weights=4,
    )


def test_equals_eq_2():
    layer = FeedForward(intermediate_dim=16, bias_initializer="random_normal")
    x = np.random.default_rng(0).normal(size=(2, 3, 8)).astype("float32")
    outputs = to_numpy(layer(x))
    w1, b1, w2, b2 = (to_numpy(w) for w in layer.weights)
    np.testing.assert_allclose(outputs, np.maximum(0, x @ w1 + b1) @ w2 + b2, atol=1e-5)


def test_dropout_reaches_the_inner_layer():
    layer = FeedForward(intermediate_dim=16, dropout=0.99)
    x = np.ones((2, 3, 8), "float32")
    assert not np.allclose(to_numpy(layer(x, training=True)), to_numpy(layer(x)))


def test_invalid_arguments():
    with pytest.raises(ValueError, match="intermediate_dim=0"):
        FeedForward(intermediate_dim=0)


def test_biases_are_drawn_independently():
    """A random bias initializer gives the two layers' biases their own values (d_ff == D)."""
    layer = FeedForward(intermediate_dim=8, bias_initializer="random_normal")
    layer.build((2, 3, 8))
    inner, outer = (to_numpy(d.bias) for d in (layer.intermediate_dense, layer.output_dense))
    assert not np.allclose(inner, outer)
