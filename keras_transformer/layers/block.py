"""What encoder and decoder layers share, and the stack they are repeated in (private)."""

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.sublayers import sublayer


class TransformerBlock(keras.layers.Layer):
    """Hyperparameters and sublayer constructors of an encoder or decoder layer.

    Subclasses write their residual sublayers out in `call` (section 5.4):
    `LayerNorm(x + Dropout(f(x)))` (post-norm, the paper), or
    `x + Dropout(f(LayerNorm(x)))` with `normalize_first=True` (pre-norm).
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
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
        rates = {
            "dropout": dropout,
            "attention_dropout": attention_dropout,
            "activation_dropout": activation_dropout,
        }
        for name, rate in rates.items():
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name} must be in [0, 1). Received: {name}={rate}")
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.normalize_first = normalize_first
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    self_attention = sublayer("_self_attention", "The self-attention `MultiHeadAttention`.")
    self_attention_norm = sublayer(
        "_self_attention_norm", "The `LayerNormalization` of the self-attention sublayer."
    )
    feed_forward = sublayer("_feed_forward", "The position-wise `FeedForward`.")
    feed_forward_norm = sublayer(
        "_feed_forward_norm", "The `LayerNormalization` of the feed-forward sublayer."
    )

    def _sublayer_kwargs(self):
        return {
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "dtype": self.dtype_policy,
        }

    def _attention(self, name, query_shape, value_shape):
        """A built `MultiHeadAttention` with `D / h` sized heads (section 3.2.2)."""
        hidden_dim = query_shape[-1]
        if hidden_dim % self.num_heads:
            raise ValueError(
                f"The model size must be divisible by num_heads. "
                f"Received: hidden size={hidden_dim}, num_heads={self.num_heads}"
            )
        attention = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=hidden_dim // self.num_heads,
            dropout=self.attention_dropout,
            name=name,
            **self._sublayer_kwargs(),
        )
        attention.build(query_shape, value_shape)
        return attention

    def _build_feed_forward(self, inputs_shape):
        """The position-wise `FeedForward` (section 3.3), its LayerNorm and dropout, built."""
        self._feed_forward = FeedForward(
            intermediate_dim=self.intermediate_dim,
            activation=self.activation,
            dropout=self.activation_dropout,
            name="feed_forward",
            **self._sublayer_kwargs(),
        )
        self._feed_forward.build(inputs_shape)
        self._feed_forward_norm = self._norm("feed_forward_norm", inputs_shape)
        self._feed_forward_dropout = self._dropout("feed_forward_dropout")

    def _feed_forward_sublayer(self, x, training=None):
        """The last sublayer of encoder and decoder layers, on `(B, T, D)` states."""
        residual = x
        x = self._feed_forward_norm(x) if self.normalize_first else x
        x = self._feed_forward(x, training=training)
        x = residual + self._feed_forward_dropout(x, training=training)
        if not self.normalize_first:
            x = self._feed_forward_norm(x)
        return x

    def _norm(self, name, inputs_shape):
        norm = keras.layers.LayerNormalization(
            epsilon=self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )
        norm.build(inputs_shape)
        return norm

    def _dropout(self, name):
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

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
                "activation_dropout": self.activation_dropout,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "normalize_first": self.normalize_first,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


class TransformerStack(keras.layers.Layer):
    """`num_layers` layers of `layer_class`, then the final LayerNorm of pre-norm stacks.

    The stack holds its layers (composition): every argument but `num_layers`
    and the base layer's (`name`, `dtype`, ...) is passed to each layer, whose
    constructor validates it.
    """

    layer_class = None

    def __init__(self, num_layers, num_heads, intermediate_dim, **kwargs):
        base_kwargs = {k: kwargs.pop(k) for k in ("name", "dtype", "trainable") if k in kwargs}
        super().__init__(**base_kwargs)
        if num_layers <= 0:
            raise ValueError(f"num_layers must be positive. Received: num_layers={num_layers}")
        self.num_layers = num_layers
        self.stack_layers = [
            self.layer_class(
                num_heads,
                intermediate_dim,
                name=f"layer_{index}",
                dtype=self.dtype_policy,
                **kwargs,
            )
            for index in range(num_layers)
        ]
        first = self.stack_layers[0]
        self._final_norm = None
        if first.normalize_first:
            self._final_norm = keras.layers.LayerNormalization(
                epsilon=first.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm"
            )
        self.supports_masking = True

    final_norm = sublayer(
        "_final_norm", "The `LayerNormalization` after a pre-norm stack; None for post-norm."
    )

    def _build_layers(self, *shapes):
        for layer in self.stack_layers:
            layer.build(*shapes)
        if self._final_norm is not None:
            self._final_norm.build(shapes[0])

    def _finish(self, outputs):
        return self._final_norm(outputs) if self._final_norm is not None else outputs

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        layer_config = self.stack_layers[0].get_config()
        for key in ("name", "trainable", "dtype"):
            layer_config.pop(key, None)
        config.update({"num_layers": self.num_layers, **layer_config})
        return config
