"""Position-wise feed-forward network (eq. 2)."""

import keras

from keras_transformer.layers.initializers import clone_initializer
from keras_transformer.layers.rows import apply_to_rows
from keras_transformer.layers.sublayers import sublayer


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2`, applied to every position alike.

    Args:
        intermediate_dim: int, inner size `d_ff`.
        activation: activation of the inner layer (ReLU in the paper).
        dropout: float, dropout rate on the inner activations (0 in the paper,
            which applies dropout only to sublayer outputs).
        use_bias: bool, whether both projections have biases.
        kernel_initializer: initializer of both kernels.
        bias_initializer: initializer of both biases.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, D)`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, D)`.

    Example:
    >>> tuple(FeedForward(intermediate_dim=16)(keras.ops.ones((2, 3, 4))).shape)
    (2, 3, 4)

    References:
        Vaswani et al., 2017, section 3.3 and eq. (2).
    """

    def __init__(
        self,
        intermediate_dim,
        activation="relu",
        dropout=0.0,
        use_bias=True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if intermediate_dim <= 0:
            raise ValueError(
                f"intermediate_dim must be positive. Received: intermediate_dim={intermediate_dim}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
        self.intermediate_dim = intermediate_dim
        self.activation = keras.activations.get(activation)
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _dense(self, units, activation, name):
        return keras.layers.Dense(
            units,
            activation=activation,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, inputs_shape):
        self._intermediate_dense = self._dense(
            self.intermediate_dim, self.activation, "intermediate"
        )
        self._intermediate_dense.build(inputs_shape)
        self._output_dense = self._dense(inputs_shape[-1], None, "output")
        self._output_dense.build(tuple(inputs_shape[:-1]) + (self.intermediate_dim,))
        self._dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    intermediate_dense = sublayer(
        "_intermediate_dense",
        "The first projection, `Dense(intermediate_dim)` with the activation.",
    )
    output_dense = sublayer("_output_dense", "The second projection, back to the model size.")

    def call(self, inputs, training=None):
        def feed_forward(rows):  # (B * T, D)
            hidden = self._intermediate_dense(rows)  # (B * T, d_ff)
            hidden = self._dropout_layer(hidden, training=training)
            return self._output_dense(hidden)  # (B * T, D)

        return apply_to_rows(feed_forward, inputs)  # (B, T, D)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
