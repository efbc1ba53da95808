"""Multi-head scaled dot-product attention with a fixed-shape key/value cache."""

import math

import keras
from keras import ops

from keras_transformer.layers import masks

# Added to masked logits before the softmax. Large enough that exp() of it is
# exactly 0 in float32, small enough that a fully masked row stays finite.
_MASK_LOGIT = -1e9


def _write_steps(cache, steps, index):
    """Writes `(B, T, H, K)` steps into a `(B, S, H, K)` cache at `index`.

    A one-hot placement and `where` rather than `ops.slice_update`: under
    TensorFlow the latter becomes XlaDynamicUpdateSlice, which TF Serving runs
    only with XLA compilation enabled. Values are copied exactly.
    """
    positions = ops.arange(ops.shape(cache)[1])  # (S,)
    offsets = ops.arange(ops.shape(steps)[1]) + index  # (T,)
    placement = ops.cast(ops.equal(offsets[:, None], positions[None]), steps.dtype)  # (T, S)
    written = ops.einsum("ts,bthk->bshk", placement, steps)  # (B, S, H, K)
    covered = ops.any(placement > 0, axis=0)[None, :, None, None]  # (1, S, 1, 1)
    return ops.where(covered, written, cache)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention, eq. (1) with the projections of section 3.2.2.

    `Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V`, computed for `num_heads`
    learned projections of queries, keys and values, concatenated and projected
    back to the query's size.

    Masking: keys are masked by the Keras mask of `value` (or `key`), queries by
    the Keras mask of `query`, and both combine with `attention_mask` and the
    causal mask. A Keras mask and the same mask passed explicitly as
    `attention_mask` give identical results. Logits and softmax are computed in
    float32 under mixed precision.

    Caching: `cache` is a `(B, 2, S, H, K)` tensor holding keys (index 0) and
    values (index 1). With `cache_update_index`, the keys and values of the
    current `query` steps are written into the cache at that position and the
    whole cache is attended (self-attention during incremental decoding; the
    causal mask accounts for the offset). Without it, the cache is attended as it
    is (encoder-decoder attention, whose keys and values `compute_cache` builds
    once). When a cache is given, key and value Keras masks are not used: pass
    `attention_mask` for cross-attention padding.

    Args:
        num_heads: int, number of attention heads `h`.
        key_dim: int, size `d_k` of each head's queries and keys.
        value_dim: int, size `d_v` of each head's values. Defaults to `key_dim`.
        dropout: float, dropout rate on the attention probabilities.
        use_bias: bool, whether the projections have biases.
        output_dim: int, size of the output. Defaults to the query's size.
        kernel_initializer: initializer for the projection kernels.
        bias_initializer: initializer for the projection biases.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        query: `(B, T, D)` queries.
        value: `(B, S, D)` values.
        key: `(B, S, D)` keys. Defaults to `value`.
        query_mask, value_mask, key_mask: bool `(B, T)` / `(B, S)` Keras masks,
            filled in automatically by Keras.
        attention_mask: bool `(B, T, S)`, True where a query may attend a key.
        use_causal_mask: bool, mask future keys (decoder self-attention).
        return_attention_scores: bool, also return the `(B, H, T, S)`
            attention probabilities.
        cache: `(B, 2, S, H, K)` key/value cache, see above.
        cache_update_index: int scalar, position of `query[:, 0]` in the cache.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, D)` output; then the attention probabilities if requested; then
        the updated cache if a cache was given.

    Example:
    >>> layer = MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = keras.random.normal((2, 5, 8))
    >>> tuple(layer(x, x).shape)
    (2, 5, 8)

    References:
        Vaswani et al., 2017, section 3.2 and eq. (1).
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_heads <= 0:
            raise ValueError(f"num_heads must be positive. Received: num_heads={num_heads}")
        if key_dim <= 0:
            raise ValueError(f"key_dim must be positive. Received: key_dim={key_dim}")
        if value_dim is not None and value_dim <= 0:
            raise ValueError(f"value_dim must be positive or None. Received: value_dim={value_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1). Received: dropout={dropout}")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def _projection(self, name, equation, output_shape, bias_axes):
        return keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=keras.initializers.get(
                keras.initializers.serialize(self.kernel_initializer)
            ),
            bias_initializer=self.bias_initializer,
            dtype=self.dtype_policy,
            name=name,
        )

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        value_dim = self.value_dim or self.key_dim
        output_dim = self.output_dim or query_shape[-1]
        self._query_dense = self._projection(
            "query", "btd,dhk->bthk", (None, self.num_heads, self.key_dim), "hk"
        )
        self._query_dense.build(query_shape)
        self._key_dense = self._projection(
            "key", "bsd,dhk->bshk", (None, self.num_heads, self.key_dim), "hk"
        )
        self._key_dense.build(key_shape)
        self._value_dense = self._projection(
            "value", "bsd,dhk->bshk", (None, self.num_heads, value_dim), "hk"
        )
        self._value_dense.build(value_shape)
        self._output_dense = self._projection(
            "attention_output", "bthk,hkd->btd", (None, output_dim), "d"
        )
        self._output_dense.build((query_shape[0], query_shape[1], self.num_heads, value_dim))
        self._dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)

    def compute_cache(self, value, key=None):
        """Projects keys and values once, for encoder-decoder attention.

        Args:
            value: `(B, S, D)` values (the encoder outputs).
            key: `(B, S, D)` keys. Defaults to `value`.

        Returns:
            `(B, 2, S, H, K)` cache to pass as `cache` without a
            `cache_update_index`.
        """
        key = value if key is None else key
        return ops.stack([self._key_dense(key), self._value_dense(value)], axis=1)

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        cache=None,
        cache_update_index=None,
        training=None,
    ):
        key = value if key is None else key
        query_states = self._query_dense(query)  # (B, T, H, K)
        start_index = 0
        if cache is None:
            key_states = self._key_dense(key)  # (B, S, H, K)
            value_states = self._value_dense(value)  # (B, S, H, K)
        elif cache_update_index is None:
            key_states, value_states = cache[:, 0], cache[:, 1]  # (B, S, H, K)
            key_mask = value_mask = None
        else:
            step_keys = self._key_dense(key)  # (B, T, H, K)
            step_values = self._value_dense(value)  # (B, T, H, K)
            key_states = _write_steps(cache[:, 0], step_keys, cache_update_index)
            value_states = _write_steps(cache[:, 1], step_values, cache_update_index)
            cache = ops.stack([key_states, value_states], axis=1)  # (B, 2, S, H, K)
            start_index = cache_update_index
            key_mask = value_mask = None

        key_padding = key_mask if key_mask is not None else value_mask
        causal = None
        if use_causal_mask:
            causal = masks.causal_mask(
                ops.shape(query_states)[1], ops.shape(key_states)[1], start_index
            )
        mask = masks.merge_attention_masks(
            query_mask=query_mask,
            key_mask=key_padding,
            attention_mask=attention_mask,
            causal=causal,
        )
        outputs, probabilities = self._attend(
            query_states, key_states, value_states, mask, training
        )
        outputs = self._output_dense(outputs)  # (B, T, D)

        results = [outputs]
        if return_attention_scores:
            results.append(probabilities)
        if cache is not None:
            results.append(cache)
        return results[0] if len(results) == 1 else tuple(results)

    def _attend(self, query_states, key_states, value_states, mask, training):
        if self.compute_dtype == "float16":
            # float16 logits overflow past 65504; bfloat16 has float32's range.
            query_states = ops.cast(query_states, "float32")
            key_states = ops.cast(key_states, "float32")
        query_states = query_states * ops.cast(1.0 / math.sqrt(self.key_dim), query_states.dtype)
        logits = ops.einsum("bthk,bshk->bhts", query_states, key_states)  # (B, H, T, S)
        # Softmax in float32 for stability under mixed precision.
        logits = ops.cast(logits, "float32")
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B, 1, T, S)
            logits = ops.where(mask, logits, _MASK_LOGIT)
        probabilities = ops.softmax(logits, axis=-1)
        probabilities = ops.cast(probabilities, self.compute_dtype)
        dropped = self._dropout_layer(probabilities, training=training)
        outputs = ops.einsum("bhts,bshk->bthk", dropped, value_states)  # (B, T, H, K)
        return outputs, probabilities

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        output_dim = self.output_dim or query_shape[-1]
        return tuple(query_shape[:-1]) + (output_dim,)

    def compute_output_spec(
        self,
        query,
        value,
        key=None,
        return_attention_scores=False,
        cache=None,
        **kwargs,
    ):
        outputs = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape), dtype=self.compute_dtype
        )
        results = [outputs]
        if return_attention_scores:
            key_length = cache.shape[2] if cache is not None else value.shape[1]
            shape = (query.shape[0], self.num_heads, query.shape[1], key_length)
            results.append(keras.KerasTensor(shape, dtype=self.compute_dtype))
        if cache is not None:
            results.append(keras.KerasTensor(cache.shape, dtype=cache.dtype))
        return results[0] if len(results) == 1 else tuple(results)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
