"""Token embedding scaled by sqrt(D), reusable as the pre-softmax projection."""

import math

import keras
from keras import ops

from keras_transformer.layers.renames import renamed
from keras_transformer.layers.rows import apply_to_rows


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Token embedding that can also serve as the output projection.

    Forward, token ids become embeddings multiplied by `sqrt(D)` (section 3.4).
    With `reverse=True` the same matrix maps `(B, T, D)` states to `(B, T, V)`
    logits (`x E^T`), which is how the paper shares "the same weight matrix
    between the two embedding layers and the pre-softmax linear
    transformation". When `pad_id` is set, the layer emits a Keras mask that
    is True for every token other than `pad_id`.

    Args:
        vocabulary_size: int, number of tokens `V`.
        hidden_dim: int, model size `D`.
        scale: bool, multiply embeddings by `sqrt(D)`.
        pad_id: int or None, padding token id for the Keras mask.
        embeddings_initializer: initializer of the `(V, D)` matrix. Defaults to
            a normal distribution with standard deviation `D ** -0.5`, which
            keeps the scaled embeddings and the tied logits at unit scale.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: int `(B, T)` token ids, or `(B, T, D)` states with `reverse`.
        reverse: bool, project states to logits instead of embedding ids.
        table: optional `(V, D)` matrix from `output_table()`, for `reverse`:
            a search computes it once and passes it to every step, so that
            an int8 table is cast once a search rather than once a step.

    Returns:
        `(B, T, D)` embeddings, or `(B, T, V)` logits with `reverse=True`.

    Example:
    >>> layer = TokenEmbedding(vocabulary_size=10, hidden_dim=4, pad_id=0)
    >>> tuple(layer(keras.ops.array([[3, 1, 0]])).shape)
    (1, 3, 4)

    References:
        Vaswani et al., 2017, section 3.4.
    """

    def __init__(
        self,
        vocabulary_size,
        hidden_dim,
        scale=True,
        pad_id=None,
        embeddings_initializer=None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if vocabulary_size <= 0:
            raise ValueError(
                f"vocabulary_size must be positive. Received: vocabulary_size={vocabulary_size}"
            )
        if hidden_dim <= 0:
            raise ValueError(f"hidden_dim must be positive. Received: hidden_dim={hidden_dim}")
        if pad_id is not None and not 0 <= pad_id < vocabulary_size:
            raise ValueError(
                f"pad_id must be a token id below vocabulary_size={vocabulary_size}. "
                f"Received: pad_id={pad_id}"
            )
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.scale = scale
        self.pad_id = pad_id
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=hidden_dim**-0.5)
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.supports_masking = pad_id is not None

    def build(self, inputs_shape=None):
        if self.quantization_mode is not None:
            if self.quantization_mode != "int8":
                raise ValueError(
                    "TokenEmbedding can be quantized to int8 only. "
                    f"Received: quantization_mode={self.quantization_mode}"
                )
            self._int8_weights()
            return
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocabulary_size, self.hidden_dim),
            initializer=self.embeddings_initializer,
        )

    def _int8_weights(self):
        shape = (self.vocabulary_size, self.hidden_dim)
        self.embeddings = self.add_weight(
            name="embeddings", shape=shape, initializer="zeros", dtype="int8", trainable=False
        )
        self.embeddings_scale = self.add_weight(
            name="embeddings_scale",
            shape=(self.vocabulary_size,),
            initializer="ones",
            trainable=False,
        )
        self._is_quantized = True

    def quantize(self, mode=None, type_check=True, config=None):
        """Stores the embeddings in int8 with one scale a token (`Model.quantize`).

        Row `i` becomes `round(E[i] * s[i])` with `s[i] = 127 / max|E[i]|`, as
        Keras quantizes its `Embedding`; lookups and the tied output projection
        divide by the scale again and compute in float (weight-only int8).

        Args:
            mode: str, "int8" (the only mode).
            type_check: bool, unused (part of Keras's `quantize` protocol).
            config: a `keras.quantizers.QuantizationConfig`, unused: the
                activations of a lookup are not quantized.
        """
        if mode != "int8":
            raise ValueError(f"TokenEmbedding can be quantized to int8 only. Received: mode={mode}")
        values, scale = keras.quantizers.abs_max_quantize(self.embeddings, axis=-1, to_numpy=True)
        del self.embeddings
        self._int8_weights()  # before the policy, whose setter would quantize again
        self.dtype_policy = keras.dtype_policies.get(f"int8_from_{self.dtype_policy.name}")
        self.embeddings.assign(values)
        self.embeddings_scale.assign(ops.squeeze(scale, axis=-1))

    def quantized_call(self, *args, **kwargs):
        """`call`, which handles int8 embeddings itself."""
        return self.call(*args, **kwargs)

    def output_table(self):
        """The `(V, D)` matrix that `reverse` multiplies states by, in the compute dtype.

        The weights themselves in float; an int8 table cast to the compute
        dtype (its scales divide the logits afterwards, in `call`).
        """
        return ops.cast(self.embeddings, self.compute_dtype)

    def call(self, inputs, reverse=False, table=None):
        quantized = self.quantization_mode is not None
        if reverse:
            embeddings = self.output_table() if table is None else table  # (V, D)

            # x (q / s)^T = (x q^T) / s, one scale a token, i.e. a column of logits.
            def project(rows):
                logits = ops.matmul(rows, ops.transpose(embeddings))
                if quantized:
                    logits = logits / ops.cast(self.embeddings_scale, logits.dtype)
                return logits

            return apply_to_rows(project, inputs)  # (B, T, V)
        ids = ops.cast(inputs, "int32")
        # The rows looked up, then cast: an int8 table is read a row at a time, not converted.
        outputs = ops.cast(ops.take(self.embeddings, ids, axis=0), self.compute_dtype)  # (B, T, D)
        if quantized:
            scale = ops.take(ops.cast(self.embeddings_scale, outputs.dtype), ids, axis=0)
            outputs = outputs / ops.expand_dims(scale, -1)
        if self.scale:
            outputs = outputs * ops.cast(math.sqrt(self.hidden_dim), outputs.dtype)
        return outputs

    def compute_mask(self, inputs, mask=None):
        if self.pad_id is None or "int" not in str(inputs.dtype):
            return mask
        return ops.not_equal(inputs, self.pad_id)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape) + (self.hidden_dim,)

    def compute_output_spec(self, inputs, reverse=False, table=None):
        if reverse:
            shape = tuple(inputs.shape[:-1]) + (self.vocabulary_size,)
        else:
            shape = self.compute_output_shape(inputs.shape)
        return keras.KerasTensor(shape, dtype=self.compute_dtype)

    @classmethod
    def from_config(cls, config):
        return cls(**renamed(config, {"embedding_dim": "hidden_dim"}))

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "hidden_dim": self.hidden_dim,
                "scale": self.scale,
                "pad_id": self.pad_id,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
