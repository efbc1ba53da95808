"""Decoder layer and decoder stack (section 3.1), with key/value caches."""

import keras
from keras import ops

from keras_transformer.layers import masks
from keras_transformer.layers.block import TransformerBlock, TransformerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(TransformerBlock):
    """One decoder layer: masked self-attention, encoder-decoder attention, FFN.

    Self-attention is causal: position `i` attends positions `<= i` only. The
    encoder-decoder attention attends every real source position. Residuals,
    dropout and norms are as in `EncoderLayer`. Padding masks default to the
    Keras masks of `inputs` and `encoder_outputs`.

    For incremental decoding pass `self_attention_cache`, a pair `(keys,
    values)` of `(B, H, T_cache, K)` tensors: without
    `self_attention_cache_update_index` the current steps are appended to it
    (a growing cache), with it they are written at that position of a
    fixed-size cache (see `MultiHeadAttention`). Optionally pass
    `cross_attention_cache` from `compute_cross_attention_cache`, so the source
    is projected only once.

    Args:
        num_heads, intermediate_dim, dropout, attention_dropout, activation,
        layer_norm_epsilon, normalize_first, kernel_initializer,
        bias_initializer: as in `EncoderLayer`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(B, T, D)` embedded target.
        encoder_outputs: `(B, S, D)`.
        decoder_padding_mask: bool `(B, T)`, True for real target tokens.
        encoder_padding_mask: bool `(B, S)`, True for real source tokens.
        self_attention_cache: `(keys, values)`, `(B, H, T_cache, K)` each, or
            None.
        self_attention_cache_update_index: int scalar, position of
            `inputs[:, 0]` in a fixed-size cache; None appends to the cache.
        cross_attention_cache: `(keys, values)`, `(B, H, S, K)` each, or None.
        return_attention_scores: bool, also return the `(B, H, T, S)`
            encoder-decoder attention probabilities.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, D)`; then the attention probabilities if requested; then the
        updated self-attention cache if one was given.

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

    def compute_cross_attention_cache(self, encoder_outputs):
        """Projects `(B, S, D)` encoder outputs once into `(keys, values)`, `(B, H, S, K)` each."""
        return self._cross_attention.compute_cache(encoder_outputs)

    def call(
        self,
        inputs,
        encoder_outputs,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
        inputs_mask=None,
        encoder_outputs_mask=None,
    ):
        if decoder_padding_mask is None:
            decoder_padding_mask = inputs_mask
        if encoder_padding_mask is None:
            encoder_padding_mask = encoder_outputs_mask
        # Masked self-attention sublayer: position i attends positions <= i.
        residual = inputs
        x = self._self_attention_norm(inputs) if self.normalize_first else inputs
        x = self._self_attention(
            x,
            x,
            query_mask=decoder_padding_mask,
            value_mask=decoder_padding_mask,
            use_causal_mask=True,
            cache=self_attention_cache,
            cache_update_index=self_attention_cache_update_index,
            grow_cache=self_attention_cache is not None
            and self_attention_cache_update_index is None,
            training=training,
        )
        if self_attention_cache is not None:
            x, self_attention_cache = x
        x = residual + self._self_attention_dropout(x, training=training)
        if not self.normalize_first:
            x = self._self_attention_norm(x)
        # Encoder-decoder attention sublayer: every real source position.
        residual = x
        x = self._cross_attention_norm(x) if self.normalize_first else x
        outputs = self._cross_attention(
            x,
            encoder_outputs,
            query_mask=decoder_padding_mask,
            attention_mask=masks.padding_mask_to_attention_mask(encoder_padding_mask),
            return_attention_scores=return_attention_scores,
            cache=cross_attention_cache,
            training=training,
        )
        # (output, [scores], [the read-only cache]) when either is asked for.
        x = outputs[0] if isinstance(outputs, tuple) else outputs
        scores = outputs[1] if return_attention_scores else None
        x = residual + self._cross_attention_dropout(x, training=training)
        if not self.normalize_first:
            x = self._cross_attention_norm(x)
        x = self._feed_forward_sublayer(x, training=training)
        results = (x,)
        if return_attention_scores:
            results += (scores,)
        if self_attention_cache is not None:
            results += (self_attention_cache,)
        return results[0] if len(results) == 1 else results


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(TransformerStack):
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
        num_heads, intermediate_dim, dropout, attention_dropout, activation,
        layer_norm_epsilon, normalize_first, kernel_initializer,
        bias_initializer: as in `EncoderLayer`.
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

    def initial_cache(self, batch_size, max_length=0):
        """An empty self-attention cache: L `(keys, values)` pairs.

        Args:
            batch_size: int or int scalar tensor, rows `B`.
            max_length: int (or int scalar tensor), positions per row: 0 (the
                default) for a growing cache, the longest output for a
                fixed-size one.

        Returns:
            list of L pairs of zeros, `(B, H, max_length, K)` each.
        """
        cache = []
        for layer in self.stack_layers:
            attention = layer._self_attention
            value_dim = attention.value_dim or attention.key_dim
            shape = (batch_size, attention.num_heads, max_length)
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

        Returns:
            `(outputs, self_attention_cache)`: `(B, T, D)` and the updated L
            pairs.
        """
        if not self.built:
            raise ValueError("call_with_cache needs a built Decoder: call it or build() first.")
        if not len(self_attention_cache) == len(cross_attention_cache) == self.num_layers:
            raise ValueError(
                f"call_with_cache takes one (keys, values) pair per layer ({self.num_layers}). "
                f"Received: {len(self_attention_cache)} self-attention and "
                f"{len(cross_attention_cache)} cross-attention pairs"
            )
        outputs, caches = inputs, []
        for layer, self_cache, cross_cache in zip(
            self.stack_layers, self_attention_cache, cross_attention_cache, strict=True
        ):
            outputs, self_cache = layer(
                outputs,
                None,  # the cross-attention cache holds the encoder outputs' projections
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=self_cache,
                self_attention_cache_update_index=cache_update_index,
                cross_attention_cache=cross_cache,
            )
            caches.append(self_cache)
        return self._finish(outputs), caches
