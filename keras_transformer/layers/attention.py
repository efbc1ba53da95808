"""Multi-head scaled dot-product attention with a fixed-shape key/value cache."""

import math

import keras
from keras import ops

from keras_transformer.layers import masks
from keras_transformer.layers.initializers import clone_initializer
from keras_transformer.layers.rows import apply_to_rows
from keras_transformer.layers.sublayers import sublayer

# Added to masked logits before the softmax. Large enough that exp() of it is
# exactly 0 in float32, small enough that a fully masked row stays finite.
_MASK_LOGIT = -1e9


def _softmax(logits, one_query=False):
    """`ops.softmax` over the last axis, also over a single key.

    A decoding step's first self-attention attends one key; `ops.softmax`
    warns on an axis of size 1 (a common mistake elsewhere, correct here), so
    that case is written out: its probability is exactly 1.

    A decoding step's softmax (`one_query`, `(B, H, 1, S)` logits) is
    composed of element-wise ops and reductions, which TensorFlow runs faster
    than its oneDNN softmax kernel on logits this small (a greedy step over
    Multi30k 14% faster).
    """
    if logits.shape[-1] == 1:
        return ops.ones_like(logits)
    if not one_query:
        return ops.softmax(logits, axis=-1)
    exponentials = ops.exp(logits - ops.max(logits, axis=-1, keepdims=True))
    return exponentials / ops.sum(exponentials, axis=-1, keepdims=True)


def _write_steps(cache, steps, index):
    """Writes `(B, H, T, K)` steps into a fixed-size `(B, H, S, K)` cache at `index`.

    A one-hot placement and `where` rather than `ops.slice_update`: under
    TensorFlow the latter becomes XlaDynamicUpdateSlice, which TF Serving runs
    only with XLA compilation enabled. Values are copied exactly. Every
    position is rewritten, which XLA (the fixed-size cache's reason to exist)
    does in place.
    """
    positions = ops.arange(ops.shape(cache)[2])  # (S,)
    offsets = ops.arange(ops.shape(steps)[2]) + index  # (T,)
    placement = ops.cast(ops.equal(offsets[:, None], positions[None]), steps.dtype)  # (T, S)
    written = ops.einsum("ts,bhtk->bhsk", placement, steps)  # (B, H, S, K)
    covered = ops.any(placement > 0, axis=0)[None, None, :, None]  # (1, 1, S, 1)
    return ops.where(covered, written, cache)


def _update_cache(cache, key_states, value_states, index, grow):
    """The `(keys, values)` cache, `(B, H, S, K)` each, with `(B, H, T, K)` steps
    appended (`grow`) or written at `index` of a fixed-size cache."""
    cached_keys, cached_values = cache
    if grow:
        keys = ops.concatenate([cached_keys, key_states], axis=2)
        return keys, ops.concatenate([cached_values, value_states], axis=2)
    return _write_steps(cached_keys, key_states, index), _write_steps(
        cached_values, value_states, index
    )


def _dense_rows(dense, rows):
    """`rows @ kernel + bias` of an `EinsumDense`, as one 2-D matrix product.

    The sublayers hold the weights (and their names in checkpoints); their
    products are taken here on `(N, *features)` rows flattened to 2-D, with the
    kernel viewed as 2-D, which TensorFlow runs several times faster than the
    einsum of a 3-D input (see `rows.apply_to_rows`). Returns `(N, outputs)`.
    """
    if dense.quantization_mode is not None:
        # A quantized layer (`Model.quantize`) holds its kernel with scales, and
        # its own call knows how to use them: run it on one-position rows.
        outputs = dense(ops.expand_dims(rows, 1))  # (N, 1, *outputs)
        return ops.reshape(outputs, (ops.shape(outputs)[0], -1))
    rows = ops.reshape(rows, (ops.shape(rows)[0], -1))  # (N, features)
    # Cast as the layer's autocast would: `call_with_cache` and `attend_cached`
    # are called directly, outside `__call__`'s autocast scope.
    kernel = ops.cast(dense.kernel, rows.dtype)
    outputs = ops.matmul(rows, ops.reshape(kernel, (ops.shape(rows)[1], -1)))
    if dense.bias is not None:
        outputs = outputs + ops.reshape(ops.cast(dense.bias, rows.dtype), (-1,))
    return outputs


def _project(dense, inputs):
    """`(B, T, D)` inputs -> `(B, T, H, K)` projections by an `EinsumDense`."""
    _, num_heads, head_dim = dense.kernel.shape

    def project(rows):  # (B * T, D) -> (B * T, H, K)
        return ops.reshape(_dense_rows(dense, rows), (-1, num_heads, head_dim))

    return apply_to_rows(project, inputs)


def _heads_first(states):
    """`(B, T, H, K)` -> `(B, H, T, K)`, the layout the cache and `_attend` use."""
    return ops.transpose(states, (0, 2, 1, 3))


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

    Caching, for incremental decoding: a cache is a pair `(keys, values)` of
    `(B, H, S, K)` tensors, heads first so that attention multiplies them
    without a transpose.
    - `call_with_cache` is self-attention over a cache: the keys and values of
      the `query` steps are added to it and the result attends the whole
      cache. With `cache_update_index=None` they are appended (a growing cache
      that holds exactly the positions decoded so far: dynamic shapes, as
      eager execution and TensorFlow graphs allow); with `cache_update_index=i`
      they are written at positions `i, i + 1, ...` of a buffer as long as the
      longest output, and later positions are masked (static shapes, as XLA
      and `jax.jit` need). It returns `(outputs, cache)`.
    - `attend_cached` attends keys and values projected once by
      `compute_cache` (encoder-decoder attention), leaving them unchanged.

    Args:
        num_heads: int, number of attention heads `h`.
        key_dim: int, size `d_k` of each head's queries and keys.
        value_dim: int, size `d_v` of each head's values. Defaults to `key_dim`.
        dropout: float, dropout rate on the attention probabilities.
        use_bias: bool, whether the projections have biases.
        output_dim: int, size of the output. Defaults to the query's size.
        kernel_initializer: initializer for the projection kernels.
        bias_initializer: initializer for the projection biases.
        fused_attention: bool or None, whether `call` uses
            `ops.dot_product_attention`; None (the default) where the backend
            has a fused kernel (JAX, PyTorch). See `uses_fused_attention`.
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
        training: bool, whether dropout is active.

    Returns:
        `(B, T, D)` output, or with `return_attention_scores` a pair of it and
        the `(B, H, T, S)` probabilities (as `keras.layers.MultiHeadAttention`).

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
        fused_attention=None,
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
        self.fused_attention = fused_attention
        self.supports_masking = True

    def _projection(self, name, equation, output_shape, bias_axes):
        return keras.layers.EinsumDense(
            equation,
            output_shape=output_shape,
            bias_axes=bias_axes if self.use_bias else None,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
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

    query_dense = sublayer(
        "_query_dense", "The query projection, an `EinsumDense` with a `(D, H, K)` kernel."
    )
    key_dense = sublayer(
        "_key_dense", "The key projection, an `EinsumDense` with a `(D, H, K)` kernel."
    )
    value_dense = sublayer(
        "_value_dense", "The value projection, an `EinsumDense` with a `(D, H, K_v)` kernel."
    )
    output_dense = sublayer(
        "_output_dense", "The output projection, an `EinsumDense` with a `(H, K_v, D)` kernel."
    )

    def compute_cache(self, value, key=None):
        """Projects keys and values once, for encoder-decoder attention.

        Args:
            value: `(B, S, D)` values (the encoder outputs).
            key: `(B, S, D)` keys. Defaults to `value`.

        Returns:
            `(keys, values)`, `(B, H, S, K)` each, for `attend_cached`.
        """
        key = value if key is None else key
        keys, values = _project(self._key_dense, key), _project(self._value_dense, value)
        return _heads_first(keys), _heads_first(values)

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
        training=None,
    ):
        key = value if key is None else key
        # Full-sequence attention without probabilities to return runs as one
        # fused kernel on (B, T, H, K) states; attention maps attend step by
        # step on (B, H, T, K) states.
        fused = not return_attention_scores and self.uses_fused_attention(training)
        query_states = _project(self._query_dense, query)  # (B, T, H, K)
        key_states = _project(self._key_dense, key)  # (B, S, H, K)
        value_states = _project(self._value_dense, value)
        causal = None
        if use_causal_mask:
            causal = masks.causal_mask(ops.shape(query)[1], ops.shape(key)[1], 0)
        mask = masks.merge_attention_masks(
            query_mask=query_mask,
            key_mask=key_mask if key_mask is not None else value_mask,
            attention_mask=attention_mask,
            causal=causal,
        )
        if fused:
            outputs = ops.dot_product_attention(
                query_states,
                key_states,
                value_states,
                mask=None if mask is None else ops.expand_dims(mask, 1),  # (B, 1, T, S)
                scale=1.0 / math.sqrt(self.key_dim),
            )  # (B, T, H, K)
            return self._output_projection(outputs)
        outputs, probabilities = self._attend(
            _heads_first(query_states),
            _heads_first(key_states),
            _heads_first(value_states),
            mask,
            training,
        )
        outputs = self._output_projection(ops.transpose(outputs, (0, 2, 1, 3)))
        return (outputs, probabilities) if return_attention_scores else outputs

    def call_with_cache(
        self,
        query,
        cache,
        cache_update_index=None,
        query_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        training=None,
    ):
        """Self-attention of the `query` steps over a cache they extend.

        Args:
            query: `(B, T, D)`, the positions after those the cache holds (T = 1
                for one decoding step); they are also the keys and values.
            cache: `(keys, values)`, `(B, H, S, K)` each.
            cache_update_index: int scalar, position of `query[:, 0]` in a
                fixed-size cache; None (the default) appends to a growing one.
            query_mask: bool `(B, T)`.
            attention_mask: bool `(B, T, S')`, S' the cache's length after the
                update.
            use_causal_mask: bool, mask keys after each query's position.
            training: bool, whether dropout is active.

        Returns:
            `(outputs, cache)`: `(B, T, D)` and the updated `(keys, values)`.
        """
        query = ops.convert_to_tensor(query)  # called directly, not through `__call__`
        query_states = _heads_first(_project(self._query_dense, query))  # (B, H, T, K)
        key_states = _heads_first(_project(self._key_dense, query))
        value_states = _heads_first(_project(self._value_dense, query))
        grow = cache_update_index is None
        start_index = ops.shape(cache[0])[2] if grow else cache_update_index
        cache = _update_cache(cache, key_states, value_states, start_index, grow)
        causal = written = None
        # A growing cache holds exactly the positions up to a single query's
        # own, so its causal mask allows every key: none is built.
        last_only = grow and query.shape[1] == 1
        if use_causal_mask and not last_only:
            causal = masks.causal_mask(ops.shape(query)[1], ops.shape(cache[0])[2], start_index)
        elif not grow:  # slots of a fixed-size cache not written yet
            end = start_index + ops.shape(query)[1]
            written = ops.expand_dims(ops.arange(ops.shape(cache[0])[2]) < end, 0)  # (1, S')
        mask = masks.merge_attention_masks(
            query_mask=query_mask, key_mask=written, attention_mask=attention_mask, causal=causal
        )
        outputs, _ = self._attend(query_states, cache[0], cache[1], mask, training)
        return self._output_projection(ops.transpose(outputs, (0, 2, 1, 3))), cache

    def attend_cached(
        self,
        query,
        cache,
        query_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        """Attention of `query` over keys and values from `compute_cache`.

        Args:
            query: `(B, T, D)` queries.
            cache: `(keys, values)`, `(B, H, S, K)` each, left unchanged.
            query_mask: bool `(B, T)`.
            attention_mask: bool `(B, T, S)` or `(B, 1, S)`, True where a query
                may attend a key (the source padding).
            return_attention_scores: bool, also return the `(B, H, T, S)`
                attention probabilities.
            training: bool, whether dropout is active.

        Returns:
            `(B, T, D)`, or with `return_attention_scores` a pair of it and the
            probabilities.
        """
        query = ops.convert_to_tensor(query)  # called directly, not through `__call__`
        query_states = _heads_first(_project(self._query_dense, query))  # (B, H, T, K)
        mask = masks.merge_attention_masks(query_mask=query_mask, attention_mask=attention_mask)
        outputs, probabilities = self._attend(query_states, cache[0], cache[1], mask, training)
        outputs = self._output_projection(ops.transpose(outputs, (0, 2, 1, 3)))
        return (outputs, probabilities) if return_attention_scores else outputs

    def _output_projection(self, outputs):
        """`(B, T, H, K)` heads -> `(B, T, D)` through the output projection."""
        return apply_to_rows(
            lambda rows: _dense_rows(self._output_dense, rows), outputs, feature_axes=2
        )

    def uses_fused_attention(self, training=None):
        """Whether `call` computes attention with `ops.dot_product_attention`.

        The fused kernel (cuDNN's flash attention under JAX on a GPU, memory
        linear in the length) has no dropout on the probabilities, needs
        values of the keys' size, and would compute float16 logits, which
        overflow past 65504; otherwise attention is computed step by step.
        TensorFlow has no fused kernel: Keras composes it from einsums on the
        `(B, T, H, K)` layout and masks built at the logits' full shape, which
        train slower on a CPU than the step-by-step path. `fused_attention`
        (constructor argument and attribute) overrides the backend's default:
        False never fuses; True fuses on TensorFlow too, where the function
        computed is the same.
        """
        same_sizes = self.value_dim in (None, self.key_dim)
        no_dropout = not training or self.dropout == 0
        has_kernel = keras.backend.backend() != "tensorflow"
        if self.fused_attention is not None:
            has_kernel = self.fused_attention
        return has_kernel and same_sizes and no_dropout and self.compute_dtype != "float16"

    def _attend(self, query_states, key_states, value_states, mask, training):
        if self.compute_dtype == "float16":
            # float16 logits overflow past 65504; bfloat16 has float32's range.
            query_states = ops.cast(query_states, "float32")
            key_states = ops.cast(key_states, "float32")
        query_states = query_states * ops.cast(1.0 / math.sqrt(self.key_dim), query_states.dtype)
        # One query a row (a decoding step): products and sums instead of
        # batched matrix products of a single row, which cost far more per call.
        one_query = query_states.shape[2] == 1
        if one_query:
            logits = ops.sum(query_states * key_states, axis=-1)[:, :, None]  # (B, H, 1, S)
        else:
            logits = ops.einsum("bhtk,bhsk->bhts", query_states, key_states)  # (B, H, T, S)
        # Softmax in float32 for stability under mixed precision.
        logits = ops.cast(logits, "float32")
        if mask is not None:
            mask = ops.expand_dims(mask, 1)  # (B, 1, T, S)
            logits = ops.where(mask, logits, _MASK_LOGIT)
        probabilities = _softmax(logits, one_query)
        probabilities = ops.cast(probabilities, self.compute_dtype)
        dropped = self._dropout_layer(probabilities, training=training)
        if one_query:
            weights = ops.transpose(dropped, (0, 1, 3, 2))  # (B, H, S, 1)
            outputs = ops.sum(weights * value_states, axis=2, keepdims=True)  # (B, H, 1, K)
        else:
            outputs = ops.einsum("bhts,bhsk->bhtk", dropped, value_states)  # (B, H, T, K)
        return outputs, probabilities

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        output_dim = self.output_dim or query_shape[-1]
        return tuple(query_shape[:-1]) + (output_dim,)

    def compute_output_spec(self, query, value, key=None, return_attention_scores=False, **kwargs):
        outputs = keras.KerasTensor(
            self.compute_output_shape(query.shape, value.shape), dtype=self.compute_dtype
        )
        if not return_attention_scores:
            return outputs
        shape = (query.shape[0], self.num_heads, query.shape[1], value.shape[1])
        return outputs, keras.KerasTensor(shape, dtype=self.compute_dtype)

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
                "fused_attention": self.fused_attention,
            }
        )
        return config
