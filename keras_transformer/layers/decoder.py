"""Decoder layer and decoder stack (section 3.1), with key/value caches."""

import keras
from keras import ops

from keras_transformer.layers import masks
from keras_transformer.layers.block import TransformerBlock, TransformerStack
from keras_transformer.layers.sublayers import sublayer


class _DecoderCall:
    """The `call` interface decoder layers and stacks share: Keras masks as defaults.

    Subclasses implement `_decode(inputs, encoder_outputs, decoder_padding_mask,
    encoder_padding_mask, return_attention_scores, training)`.
    """

    def call(
        self,
        inputs,
        encoder_outputs,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        return_attention_scores=False,
        training=None,
        inputs_mask=None,
        encoder_outputs_mask=None,
    ):
        if decoder_padding_mask is None:
            decoder_padding_mask = inputs_mask
        if encoder_padding_mask is None:
            encoder_padding_mask = encoder_outputs_mask
        return self._decode(
            inputs,
            encoder_outputs,
            decoder_padding_mask,
            encoder_padding_mask,
            return_attention_scores,
            training,
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(_DecoderCall, TransformerBlock):
    """One decoder layer: masked self-attention, encoder-decoder attention, FFN.

    Self-attention is causal: position `i` attends positions `<= i` only. The
    encoder-decoder attention attends every real source position. Residuals,
    dropout and norms are as in `EncoderLayer`. Padding masks default to the
    Keras masks of `inputs` and `encoder_outputs`.

    `call` decodes whole targets; `call_with_cache` decodes the positions
    after those a self-attention cache holds (see `Decoder.call_with_cache`).

    Args:
        num_heads, intermediate_dim, dropout, attention_dropout,
        activation_dropout, activation, layer_norm_epsilon, normalize_first,
        kernel_initializer, bias_initializer: as in `EncoderLayer`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, D)` embedded target.
        encoder_outputs: `(B, S, D)`.
        decoder_padding_mask: bool `(B, T)`, True for real target tokens.
        encoder_padding_mask: bool `(B, S)`, True for real source tokens.
        return_attention_scores: bool, also return the `(B, H, T, S)`
            encoder-decoder attention probabilities.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, D)`, or with `return_attention_scores` a pair of it and the
        attention probabilities.

    Example:
    >>> layer = DecoderLayer(num_heads=2, intermediate_dim=16)
    >>> tuple(layer(keras.ops.ones((2, 4, 8)), keras.ops.ones((2, 5, 8))).shape)
    (2, 4, 8)

    References:
        Vaswani et al., 2017, sections 3.1, 3.2.3 and 5.4.
    """

    def build(self, inputs_shape, encoder_outputs_shape):
        self._self_attention = self._attention("self_attention", inputs_shape, inputs_shape)
        self._self_attention_norm = self._norm("self_attention_norm", inputs_shape)
        self._self_attention_dropout = self._dropout("self_attention_dropout")
        self._cross_attention = self._attention(
            "cross_attention", inputs_shape, encoder_outputs_shape
        )
        self._cross_attention_norm = self._norm("cross_attention_norm", inputs_shape)
        self._cross_attention_dropout = self._dropout("cross_attention_dropout")
        self._build_feed_forward(inputs_shape)

    cross_attention = sublayer("_cross_attention", "The encoder-decoder `MultiHeadAttention`.")
    cross_attention_norm = sublayer(
        "_cross_attention_norm",
        "The `LayerNormalization` of the encoder-decoder attention sublayer.",
    )

    def compute_cross_attention_cache(self, encoder_outputs):
        """Projects `(B, S, D)` encoder outputs once into `(keys, values)`, `(B, H, S, K)` each."""
        return self._cross_attention.compute_cache(encoder_outputs)

    def _decode(self, inputs, encoder_outputs, decoder_padding_mask, encoder_padding_mask, *flags):
        return_attention_scores, training = flags

        def self_attend(x):  # position i attends positions <= i
            return self._self_attention(
                x,
                x,
                query_mask=decoder_padding_mask,
                value_mask=decoder_padding_mask,
                use_causal_mask=True,
                training=training,
            )

        def cross_attend(x):  # every real source position
            outputs = self._cross_attention(
                x,
                encoder_outputs,
                query_mask=decoder_padding_mask,
                attention_mask=masks.padding_mask_to_attention_mask(encoder_padding_mask),
                return_attention_scores=return_attention_scores,
                training=training,
            )
            return outputs if return_attention_scores else (outputs, None)

        x, scores = self._sublayers(inputs, self_attend, cross_attend, training)
        return (x, scores) if return_attention_scores else x

    def call_with_cache(
        self,
        inputs,
        self_attention_cache,
        cross_attention_cache,
        encoder_padding_mask=None,
        cache_update_index=None,
        return_attention_scores=False,
    ):
        """Decodes the positions after those `self_attention_cache` holds (no dropout).

        Args:
            inputs: `(B, T, D)` embedded target at the new positions.
            self_attention_cache: `(keys, values)`, `(B, H, T_cache, K)` each.
            cross_attention_cache: `(keys, values)`, `(B, H, S, K)` each, from
                `compute_cross_attention_cache`.
            encoder_padding_mask: bool `(B, S)`, True for real source tokens.
            cache_update_index: int scalar, position of `inputs[:, 0]` in a
                fixed-size cache; None (the default) appends to a growing one.
            return_attention_scores: bool, also return the `(B, H, T, S)`
                encoder-decoder attention probabilities.

        Returns:
            `(outputs, self_attention_cache)`: `(B, T, D)` and the updated pair;
            with `return_attention_scores`, the probabilities third.
        """
        inputs, caches = ops.convert_to_tensor(inputs), []  # called directly, not by Keras

        def self_attend(x):
            x, cache = self._self_attention.call_with_cache(
                x, self_attention_cache, cache_update_index, use_causal_mask=True
            )
            caches.append(cache)
            return x

        def cross_attend(x):
            return self._cross_attention.attend_cached(
                x,
                cross_attention_cache,
                attention_mask=masks.padding_mask_to_attention_mask(encoder_padding_mask),
                return_attention_scores=True,
            )

        x, scores = self._sublayers(inputs, self_attend, cross_attend, training=False)
        return (x, caches[0], scores) if return_attention_scores else (x, caches[0])

    def _sublayers(self, inputs, self_attend, cross_attend, training):
        """The three residual sublayers around the two attention functions.

        Returns:
            `(outputs, scores)`: `(B, T, D)` and the `(B, H, T, S)`
            encoder-decoder attention probabilities, or None where
            `cross_attend` returned none.
        """
        # Masked self-attention sublayer.
        residual = inputs
        x = self._self_attention_norm(inputs) if self.normalize_first else inputs
        x = residual + self._self_attention_dropout(self_attend(x), training=training)
        if not self.normalize_first:
            x = self._self_attention_norm(x)
        # Encoder-decoder attention sublayer.
        residual = x
        x = self._cross_attention_norm(x) if self.normalize_first else x
        x, scores = cross_attend(x)
        x = residual + self._cross_attention_dropout(x, training=training)
        if not self.normalize_first:
            x = self._cross_attention_norm(x)
        return self._feed_forward_sublayer(x, training=training), scores


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(_DecoderCall, TransformerStack):
    """A stack of `num_layers` `DecoderLayer`s (N = 6 in the paper).

    `call` decodes whole target sequences (training, attention maps);
    `call_with_cache` decodes the positions after those its caches hold, one
    step of incremental decoding. Caches are lists with one `(keys, values)`
    pair per layer: the self-attention cache holds `(B, H, T_cache, K)` pairs
    (`initial_cache` makes an empty one, growing or fixed-size) and the
    cross-attention cache `(B, H, S, K)` pairs (`compute_cross_attention_cache`).
    Separate tensors per layer let a step append to or rewrite each layer's
    cache without copying the others.

    Args:
        num_layers: int, number of layers `N`.
        num_heads, intermediate_dim, dropout, attention_dropout,
        activation_dropout, activation, layer_norm_epsilon, normalize_first,
        kernel_initializer, bias_initializer: as in `EncoderLayer`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, D)` embedded target.
        encoder_outputs: `(B, S, D)`.
        decoder_padding_mask: bool `(B, T)`; defaults to the Keras mask.
        encoder_padding_mask: bool `(B, S)`; defaults to the Keras mask.
        return_attention_scores: bool, also return the `(B, L, H, T, S)`
            encoder-decoder attention probabilities of every layer.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, D)`; with `return_attention_scores`, a pair of it and the
        attention probabilities.

    Example:
    >>> decoder = Decoder(num_layers=2, num_heads=2, intermediate_dim=16)
    >>> tuple(decoder(keras.ops.ones((2, 4, 8)), keras.ops.ones((2, 5, 8))).shape)
    (2, 4, 8)

    References:
        Vaswani et al., 2017, section 3.1.
    """

    layer_class = DecoderLayer

    def build(self, inputs_shape, encoder_outputs_shape):
        self._build_layers(inputs_shape, encoder_outputs_shape)

    def initial_cache(self, batch_size, cache_length=0):
        """An empty self-attention cache: L `(keys, values)` pairs.

        Args:
            batch_size: int or int scalar tensor, rows `B`.
            cache_length: int (or int scalar tensor), positions per row: 0 (the
                default) for a growing cache, the longest output for a
                fixed-size one.

        Returns:
            list of L pairs of zeros, `(B, H, cache_length, K)` each.
        """
        cache = []
        for layer in self.stack_layers:
            attention = layer.self_attention
            value_dim = attention.value_dim or attention.key_dim
            shape = (batch_size, attention.num_heads, cache_length)
            cache.append(
                (
                    ops.zeros(shape + (attention.key_dim,), dtype=self.compute_dtype),
                    ops.zeros(shape + (value_dim,), dtype=self.compute_dtype),
                )
            )
        return cache

    def compute_cross_attention_cache(self, encoder_outputs):
        """`(B, S, D)` encoder outputs -> L `(keys, values)` pairs, `(B, H, S, K)` each."""
        return [layer.compute_cross_attention_cache(encoder_outputs) for layer in self.stack_layers]

    def _decode(self, inputs, encoder_outputs, decoder_padding_mask, encoder_padding_mask, *flags):
        return_attention_scores, training = flags
        outputs, scores = inputs, []
        for layer in self.stack_layers:
            outputs = layer(
                outputs,
                encoder_outputs,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                outputs, layer_scores = outputs
                scores.append(layer_scores)
        outputs = self._finish(outputs)
        if return_attention_scores:
            return outputs, ops.stack(scores, axis=1)  # (B, L, H, T, S)
        return outputs

    def call_with_cache(
        self,
        inputs,
        self_attention_cache,
        cross_attention_cache,
        encoder_padding_mask=None,
        cache_update_index=None,
        return_attention_scores=False,
    ):
        """Decodes the positions after those the caches hold (no dropout).

        The caches stand in for the target prefix and the encoder outputs:
        the result equals the matching positions of `call` on the whole
        target (tested), at the cost of the new positions alone.

        Args:
            inputs: `(B, T, D)` embedded target at the new positions (T = 1
                for one decoding step).
            self_attention_cache: list of L `(keys, values)` pairs,
                `(B, H, T_cache, K)` each, from `initial_cache` or the last call.
            cross_attention_cache: list of L `(keys, values)` pairs,
                `(B, H, S, K)` each, from `compute_cross_attention_cache`.
            encoder_padding_mask: bool `(B, S)`, True for real source tokens.
            cache_update_index: int scalar, position of `inputs[:, 0]` in
                fixed-size caches; None (the default) appends to growing caches.
            return_attention_scores: bool, also return every layer's
                `(B, L, H, T, S)` encoder-decoder attention probabilities.

        Returns:
            `(outputs, self_attention_cache)`: `(B, T, D)` and the updated L
            pairs; with `return_attention_scores`, the probabilities third
            (as `call` appends them).
        """
        if not self.built:
            raise ValueError("call_with_cache needs a built Decoder: call it or build() first.")
        if not len(self_attention_cache) == len(cross_attention_cache) == self.num_layers:
            raise ValueError(
                f"call_with_cache takes one (keys, values) pair per layer ({self.num_layers}). "
                f"Received: {len(self_attention_cache)} self-attention and "
                f"{len(cross_attention_cache)} cross-attention pairs"
            )
        outputs, caches, scores = ops.convert_to_tensor(inputs), [], []
        for layer, self_cache, cross_cache in zip(
            self.stack_layers, self_attention_cache, cross_attention_cache, strict=True
        ):
            outputs, self_cache, layer_scores = layer.call_with_cache(
                outputs, self_cache, cross_cache, encoder_padding_mask, cache_update_index, True
            )
            caches.append(self_cache)
            scores.append(layer_scores)
        if return_attention_scores:
            return self._finish(outputs), caches, ops.stack(scores, axis=1)  # (B, L, H, T, S)
        return self._finish(outputs), caches
