"""int8 weights for a CPU export: Keras's `Model.quantize`, on a copy of the model.

Two modes, both Keras's own int8 scheme (`keras.quantizers.abs_max_quantize`:
symmetric, one scale per output channel, 127 / max |w|):
- "int8": matrix weights in int8, and each matrix product's input rows
  quantized to int8 on the fly (one scale a row), so the products run on
  int8 (`BatchMatMulV3` int8 -> int32 in TensorFlow);
- "int8-weights": matrix weights in int8, products in float32 on the
  weights cast back (weight-only; CTranslate2's `int8_float32` stores the same).
The embeddings (`TokenEmbedding`, also the tied output projection) are stored
in int8 with one scale a token in both modes and used in float32.
Keras is imported in the functions, so that commands can offer the modes
without loading it.
"""

QUANTIZE_MODES = ("int8", "int8-weights")


def _has_matrices(layer):
    """Whether `Model.quantize` should quantize `layer` (the layers holding matrices)."""
    import keras

    from keras_transformer.layers import TokenEmbedding

    return isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense, TokenEmbedding))


def quantized(model, mode):
    """A copy of `model` with its matrix weights in int8; `model` is left as it is.

    Args:
        model: a built `Transformer` computing in float32.
        mode: str, one of `QUANTIZE_MODES`.

    Returns:
        A new built `Transformer` whose `Dense`, `EinsumDense` and
        `TokenEmbedding` layers hold int8 weights and float32 scales.

    Raises:
        ValueError: an unknown `mode`.
    """
    if mode not in QUANTIZE_MODES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_MODES)}. Received: {mode}")
    import keras

    copy = model.__class__.from_config(model.get_config())
    copy.build_from_config(model.get_build_config())
    copy.set_weights(model.get_weights())
    config = None
    if mode == "int8-weights":
        # No activation quantizer: Keras then multiplies float inputs by the
        # dequantized kernel. The weight quantizer stays Keras's default.
        config = keras.quantizers.Int8QuantizationConfig(
            weight_quantizer=None, activation_quantizer=None
        )
    copy.quantize("int8", config=config, filters=_has_matrices)
    return copy
