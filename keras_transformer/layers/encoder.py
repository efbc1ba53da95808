"""Encoder layer and encoder stack (section 3.1)."""

import keras

from keras_transformer.layers.block import TransformerBlock, TransformerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(TransformerBlock):
    """One encoder layer: self-attention, then a position-wise feed-forward net.

    Each sublayer is wrapped as `LayerNorm(x + Dropout(Sublayer(x)))`
    (section 5.4), or as `x + Dropout(Sublayer(LayerNorm(x)))` with
    `normalize_first=True`. Padded positions are masked as keys and as queries;
    the Keras mask of `inputs` is used when `padding_mask` is not given.

    Args:
        num_heads: int, attention heads `h`.
        intermediate_dim: int, feed-forward inner size `d_ff`.
        dropout: float, residual dropout `P_drop` on each sublayer's output.
        attention_dropout: float, dropout on attention probabilities.
        activation_dropout: float, dropout on the feed-forward's inner
            activations (0 in the paper).
        activation: feed-forward activation (ReLU in the paper).
        layer_norm_epsilon: float, LayerNorm epsilon.
        normalize_first: bool, pre-norm instead of the paper's post-norm.
        kernel_initializer: initializer of all kernels.
        bias_initializer: initializer of all biases.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, S, D)`.
        padding_mask: bool `(B, S)`, True for real tokens.
        attention_mask: bool `(B, S, S)`, True where a position may attend.
        training: bool, whether dropout is active.

    Returns:
        `(B, S, D)`.

    Example:
    >>> layer = EncoderLayer(num_heads=2, intermediate_dim=16)
    >>> tuple(layer(keras.ops.ones((2, 5, 8))).shape)
    (2, 5, 8)

    References:
        Vaswani et al., 2017, sections 3.1 and 5.4.
    """

    def build(self, inputs_shape):
        self._self_attention = self._attention("self_attention", inputs_shape, inputs_shape)
        self._self_attention_norm = self._norm("self_attention_norm", inputs_shape)
        self._self_attention_dropout = self._dropout("self_attention_dropout")
        self._build_feed_forward(inputs_shape)

    def call(self, inputs, padding_mask=None, attention_mask=None, training=None, mask=None):
        padding_mask = mask if padding_mask is None else padding_mask
        # Self-attention sublayer: every real position attends every real one.
        residual = inputs
        x = self._self_attention_norm(inputs) if self.normalize_first else inputs
        x = self._self_attention(
            x,
            x,
            query_mask=padding_mask,
            value_mask=padding_mask,
            attention_mask=attention_mask,
            training=training,
        )
        x = residual + self._self_attention_dropout(x, training=training)
        if not self.normalize_first:
            x = self._self_attention_norm(x)
        x = self._feed_forward_sublayer(x, training=training)
        return x


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(TransformerStack):
    """A stack of `num_layers` `EncoderLayer`s (N = 6 in the paper).

    With `normalize_first=True` a final LayerNorm follows the stack, as pre-norm
    Transformers need. Takes embedded inputs; the `Transformer` model adds
    token embeddings and positional encodings before it.

    Args:
        num_layers: int, number of layers `N`.
        num_heads, intermediate_dim, dropout, attention_dropout,
        activation_dropout, activation, layer_norm_epsilon, normalize_first,
        kernel_initializer, bias_initializer: as in `EncoderLayer`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, S, D)` embedded source.
        padding_mask: bool `(B, S)`, True for real tokens. Defaults to the
            Keras mask of `inputs`.
        training: bool, whether dropout is active.

    Returns:
        `(B, S, D)` encoder outputs.

    Example:
    >>> encoder = Encoder(num_layers=2, num_heads=2, intermediate_dim=16)
    >>> tuple(encoder(keras.ops.ones((2, 5, 8))).shape)
    (2, 5, 8)

    References:
        Vaswani et al., 2017, section 3.1.
    """

    layer_class = EncoderLayer

    def build(self, inputs_shape):
        self._build_layers(inputs_shape)

    def call(self, inputs, padding_mask=None, training=None, mask=None):
        padding_mask = mask if padding_mask is None else padding_mask
        outputs = inputs
        for layer in self.stack_layers:
            outputs = layer(outputs, padding_mask=padding_mask, training=training)
        return self._finish(outputs)
