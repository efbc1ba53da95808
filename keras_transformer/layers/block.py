"""Shared construction for encoder and decoder layers and stacks (private)."""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import FeedForward


class TransformerBlock(keras.layers.Layer):
    """Hyperparameters, sublayer factories and the residual rule of a layer.

    Each sublayer is wrapped as in section 5.4: `LayerNorm(x + Dropout(f(x)))`
    (post-norm, the paper), or `x + Dropout(f(LayerNorm(x)))` with
    `normalize_first=True` (pre-norm).
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        dropout=0.1,
        attention_dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-6,
        normalize_first=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_heads <= 0:
            raise ValueError(f"num_heads must be positive. Received: num_heads={num_heads}")
        if intermediate_dim <= 0:
            raise ValueError(
                f"intermediate_dim must be positive. Received: intermediate_dim={intermediate_dim}"
            )
        for name, rate in (("dropout", dropout), ("attention_dropout", attention_dropout)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must be in [0, 1). Received: {name}={rate}")
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.normalize_first = normalize_first
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _key_dim(self, hidden_dim):
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"The model size must be divisible by num_heads. "
                f"Received: hidden size={hidden_dim}, num_heads={self.num_heads}"
            )
        return hidden_dim // self.num_heads

    def _sublayer_kwargs(self):
        return {
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "dtype": self.dtype_policy,
        }

    def _make_attention(self, name, hidden_dim):
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=self._key_dim(hidden_dim),
            dropout=self.attention_dropout,
            name=name,
            **self._sublayer_kwargs(),
        )

    def _make_feed_forward(self, name):
        return FeedForward(
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            name=name,
            **self._sublayer_kwargs(),
        )

    def _make_residual(self, name, inputs_shape):
        """The built LayerNorm and the Dropout that wrap sublayer `name`."""
        norm = self._make_norm(f"{name}_norm")
        norm.build(inputs_shape)
        return norm, self._make_dropout(f"{name}_dropout")

    def _make_norm(self, name):
        return keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def _make_dropout(self, name):
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

    def _residual(self, inputs, sublayer, norm, dropout, training):
        """Applies `sublayer` with the residual, dropout and norm of section 5.4.

        `sublayer` maps `(B, T, D)` to `(B, T, D)` and may return extra values as
        a tuple after its output; those are returned unchanged.
        """
        outputs = sublayer(norm(inputs) if self.normalize_first else inputs)
        outputs, extra = (outputs[0], outputs[1:]) if isinstance(outputs, tuple) else (outputs, ())
        outputs = inputs + dropout(outputs, training=training)
        if not self.normalize_first:
            outputs = norm(outputs)
        return (outputs, *extra) if extra else outputs

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "normalize_first": self.normalize_first,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


class TransformerStack(TransformerBlock):
    """A `TransformerBlock` repeated `num_layers` times, plus the final norm of
    pre-norm stacks."""

    layer_class = None

    def __init__(self, num_layers, num_heads, intermediate_dim, **kwargs):
        super().__init__(num_heads, intermediate_dim, **kwargs)
        if num_layers <= 0:
            raise ValueError(f"num_layers must be positive. Received: num_layers={num_layers}")
        self.num_layers = num_layers

    def _build_layers(self, *shapes):
        layer_config = {
            key: value
            for key, value in TransformerBlock.get_config(self).items()
            if key not in ("name", "trainable")
        }
        self.stack_layers = []
        for index in range(self.num_layers):
            layer = self.layer_class(name=f"layer_{index}", **layer_config)
            layer.build(*shapes)
            self.stack_layers.append(layer)
        self._final_norm = None
        if self.normalize_first:
            self._final_norm = self._make_norm("final_norm")
            self._final_norm.build(shapes[0])

    def _finish(self, outputs):
        return self._final_norm(outputs) if self._final_norm is not None else outputs

    def get_config(self):
        config = super().get_config()
        config["num_layers"] = self.num_layers
        return config
