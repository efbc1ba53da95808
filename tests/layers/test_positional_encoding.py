import math

import keras
import numpy as np
import pytest

from keras_transformer.layers import PositionalEncoding
from tests.test_case import run_layer_test, to_numpy


def paper_sinusoid(length, depth, base=10000.0):
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...), element by element."""
    table = np.zeros((length, depth))
    for pos in range(length):
        for i in range(depth // 2):
            angle = pos / base ** (2 * i / depth)
            table[pos, 2 * i] = math.sin(angle)
            table[pos, 2 * i + 1] = math.cos(angle)
    return table


def halves_sinusoid(length, depth, base=10000.0):
    """Marian's table: the paper's angles, sines in the first half, cosines in the second."""
    angles = np.array([[pos / base ** (2 * (j // 2) / depth) for j in range(depth)]
                       for pos in range(length)])  # fmt: skip
    return np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1)


def test_layer_basics():
    run_layer_test(
        PositionalEncoding,
        init_kwargs={},
        input_data={"inputs": np.zeros((2, 5, 8), "float32")},
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=0,
        run_training_check=False,
    )


def test_learned_layer_basics():
    run_layer_test(
        PositionalEncoding,
        init_kwargs={"learned": True, "max_positions": 10},
        input_data={"inputs": np.zeros((2, 5, 8), "float32")},
        expected_output_shape=(2, 5, 8),
        expected_num_trainable_weights=1,
    )


def test_rows_equal_the_paper_formula():
    outputs = to_numpy(PositionalEncoding()(np.zeros((1, 50, 16), "float32")))
    np.testing.assert_allclose(outputs[0], paper_sinusoid(50, 16), atol=1e-5)


def test_concatenated_rows_equal_marians_table():
    layer = PositionalEncoding(sinusoid_layout="concatenated")
    outputs = to_numpy(layer(np.zeros((1, 50, 16), "float32")))
    np.testing.assert_allclose(outputs[0], halves_sinusoid(50, 16), atol=1e-5)
    step = to_numpy(layer(np.zeros((1, 1, 16), "float32"), start_index=7))
    np.testing.assert_allclose(step[0, 0], outputs[0, 7], atol=1e-6)
    restored = PositionalEncoding.from_config(layer.get_config())
    assert restored.sinusoid_layout == "concatenated"


def test_adds_to_inputs_and_works_for_any_length():
    inputs = np.random.default_rng(0).normal(size=(2, 700, 6)).astype("float32")
    outputs = to_numpy(PositionalEncoding()(inputs))
    np.testing.assert_allclose(
        outputs - inputs, np.broadcast_to(paper_sinusoid(700, 6), inputs.shape), atol=1e-4
    )


def test_start_index_continues_the_sequence():
    layer = PositionalEncoding()
    full = to_numpy(layer(np.zeros((1, 9, 8), "float32")))
    step = to_numpy(layer(np.zeros((1, 1, 8), "float32"), start_index=6))
    np.testing.assert_allclose(step[0, 0], full[0, 6], atol=1e-6)


def test_learned_start_index_reads_the_table():
    layer = PositionalEncoding(learned=True, max_positions=10, initializer="random_normal")
    full = to_numpy(layer(np.zeros((1, 9, 4), "float32")))
    step = to_numpy(layer(np.zeros((1, 1, 4), "float32"), start_index=6))
    np.testing.assert_array_equal(step[0, 0], full[0, 6])
    np.testing.assert_array_equal(full[0], to_numpy(layer.position_embeddings)[:9])


def test_keras_mask_passes_through():
    inputs = keras.Input((4,), dtype="int32")
    states = keras.layers.Embedding(10, 8, mask_zero=True)(inputs)
    outputs = PositionalEncoding()(states)
    assert outputs._keras_mask is not None


def test_invalid_arguments():
    with pytest.raises(ValueError, match="max_positions=None"):
        PositionalEncoding(learned=True)
    with pytest.raises(ValueError, match="even model size"):
        PositionalEncoding()(np.zeros((1, 3, 5), "float32"))
    with pytest.raises(ValueError, match="sinusoid_layout='halves'"):
        PositionalEncoding(sinusoid_layout="halves")
