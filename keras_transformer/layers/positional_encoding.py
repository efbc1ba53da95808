"""Sinusoidal and learned positional encodings (section 3.5)."""

import math

import keras
from keras import ops

from keras_transformer.layers.renames import renamed

SINUSOID_LAYOUTS = ("interleaved", "concatenated")


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds position information to a sequence of embeddings.

    The default encoding is the paper's fixed sinusoid, defined for any length:
    `PE(pos, 2i) = sin(pos / max_wavelength^(2i / D))` and
    `PE(pos, 2i + 1) = cos(pos / max_wavelength^(2i / D))`. With
    `sinusoid_layout="concatenated"` the same sines fill the first `D/2`
    columns and the cosines the last `D/2` (Marian's and tensor2tensor's
    layout), so that models trained that way load as they are. With
    `learned=True` a trainable `(max_positions, D)` table is used instead
    (Table 3, row E). The Keras mask of the inputs passes through unchanged.

    Args:
        max_wavelength: float, the base of the sinusoid wavelengths (10000 in
            the paper).
        learned: bool, use learned position embeddings instead of sinusoids.
        max_positions: int, the longest sequence a learned table covers. Required
            with `learned=True`, ignored otherwise.
        initializer: initializer of the learned table.
        sinusoid_layout: str, "interleaved" (the paper's: sines in even
            columns, cosines in odd ones) or "concatenated" (sines, then
            cosines).
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, D)` embeddings.
        start_index: int scalar, position of `inputs[:, 0]` (non-zero when
            decoding one step at a time). Defaults to 0.

    Returns:
        `(B, T, D)` tensor: `inputs + PE[start_index : start_index + T]`.

    Example:
    >>> layer = PositionalEncoding()
    >>> tuple(layer(keras.ops.zeros((1, 3, 4))).shape)
    (1, 3, 4)

    References:
        Vaswani et al., 2017, section 3.5 and Table 3.
    """

    def __init__(
        self,
        max_wavelength=10000.0,
        learned=False,
        max_positions=None,
        initializer="glorot_uniform",
        sinusoid_layout="interleaved",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if sinusoid_layout not in SINUSOID_LAYOUTS:
            raise ValueError(
                f"sinusoid_layout must be one of {SINUSOID_LAYOUTS}. "
                f"Received: sinusoid_layout={sinusoid_layout!r}"
            )
        if max_wavelength <= 0:
            raise ValueError(
                f"max_wavelength must be positive. Received: max_wavelength={max_wavelength}"
            )
        if learned and (max_positions is None or max_positions <= 0):
            raise ValueError(
                "A learned positional encoding needs a positive max_positions. "
                f"Received: max_positions={max_positions}"
            )
        self.max_wavelength = max_wavelength
        self.learned = learned
        self.max_positions = max_positions
        self.initializer = keras.initializers.get(initializer)
        self.sinusoid_layout = sinusoid_layout
        self.supports_masking = True

    def build(self, inputs_shape):
        hidden_dim = inputs_shape[-1]
        if hidden_dim % 2 and not self.learned:
            raise ValueError(
                "A sinusoidal positional encoding needs an even model size. "
                f"Received: inputs_shape={inputs_shape}"
            )
        if self.learned:
            self.position_embeddings = self.add_weight(
                name="position_embeddings",
                shape=(self.max_positions, hidden_dim),
                initializer=self.initializer,
            )

    def encoding(self, length, hidden_dim, start_index=0):
        """The `(T, D)` encoding of positions `start_index .. start_index + T - 1`."""
        if self.learned:
            return ops.slice(
                ops.convert_to_tensor(self.position_embeddings),
                [start_index, 0],
                [length, hidden_dim],
            )
        positions = ops.cast(ops.arange(length) + start_index, "float32")  # (T,)
        # 1 / max_wavelength^(2i / D) for i = 0 .. D/2 - 1
        inverse_frequencies = ops.exp(
            ops.arange(0, hidden_dim, 2, dtype="float32")
            * (-math.log(self.max_wavelength) / hidden_dim)
        )
        angles = ops.expand_dims(positions, 1) * ops.expand_dims(inverse_frequencies, 0)
        if self.sinusoid_layout == "concatenated":
            return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)  # (T, D)
        # Interleave so that even columns hold sines and odd columns cosines.
        encoding = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (T, D/2, 2)
        return ops.reshape(encoding, (length, hidden_dim))  # (T, D)

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        encoding = self.encoding(shape[1], shape[2], start_index)
        return inputs + ops.cast(ops.expand_dims(encoding, 0), inputs.dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    @classmethod
    def from_config(cls, config):
        return cls(**renamed(config, {"max_length": "max_positions"}))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_wavelength": self.max_wavelength,
                "learned": self.learned,
                "max_positions": self.max_positions,
                "initializer": keras.initializers.serialize(self.initializer),
                "sinusoid_layout": self.sinusoid_layout,
            }
        )
        return config
