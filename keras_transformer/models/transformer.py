"""The encoder-decoder Transformer model (section 3)."""

import keras
from keras import ops

from keras_transformer.layers.decoder import Decoder
from keras_transformer.layers.embedding import TokenEmbedding
from keras_transformer.layers.encoder import Encoder
from keras_transformer.layers.positional_encoding import PositionalEncoding
from keras_transformer.layers.renames import renamed
from keras_transformer.models.presets import PRESETS

INPUT_KEYS = ("source_ids", "target_input_ids")


def _split_inputs(inputs):
    if isinstance(inputs, dict):
        missing = [key for key in INPUT_KEYS if key not in inputs]
        if missing:
            raise ValueError(f"Transformer inputs need the keys {INPUT_KEYS}. Missing: {missing}")
        return inputs["source_ids"], inputs["target_input_ids"]
    if isinstance(inputs, (list, tuple)) and len(inputs) == 2:
        return tuple(inputs)
    raise ValueError(
        "Transformer inputs must be (source_ids, target_input_ids) or a dict with "
        f"those keys. Received: {type(inputs).__name__}"
    )


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The Transformer of "Attention Is All You Need".

    `model((source_ids, target_input_ids))` returns float32 logits over the
    target vocabulary. Tokens equal to `pad_id` are masked throughout: as
    attention keys and queries in the encoder and the decoder, except the
    decoder's first input, the start token (Marian models start with the
    padding token). The decoder is causal. Embeddings are multiplied by
    `sqrt(D)`, summed with positional encodings and passed through dropout
    (section 5.4). By default one embedding matrix serves the source, the
    target and the pre-softmax projection (section 3.4), which requires a
    shared vocabulary.

    Args:
        vocabulary_size: int, size of the (source, or shared) vocabulary.
        num_layers: int, layers `N` in each of the encoder and decoder.
        hidden_dim: int, model size `d_model`.
        intermediate_dim: int, feed-forward size `d_ff`.
        num_heads: int, attention heads `h`.
        dropout: float, `P_drop` for residuals and embeddings.
        attention_dropout: float, dropout on attention probabilities.
        activation_dropout: float, dropout on the feed-forward's inner
            activations (fairseq's `activation_dropout`, OpenNMT-tf's
            `ffn_dropout`; 0 in the paper).
        activation: feed-forward activation.
        layer_norm_epsilon: float.
        normalize_first: bool, pre-norm layers instead of the paper's post-norm.
        target_vocabulary_size: int or None, size of a separate target
            vocabulary. Defaults to `vocabulary_size`.
        share_source_target_embeddings: bool, one embedding for source and
            target (needs equal vocabulary sizes).
        tie_output_embeddings: bool, reuse the target embedding as the
            pre-softmax projection.
        learned_positions: bool, learned positional embeddings instead of
            sinusoids (needs `max_positions`).
        max_positions: int or None, the positions a learned table covers.
        pad_id: int, padding token id.
        bos_id: int, start-of-sequence id that begins decoder inputs.
        eos_id: int, end-of-sequence id that ends decoder outputs.
        unk_id: int, the unknown token's id (banned by the searches'
            `disable_unk`).
        sinusoid_layout: str, "interleaved" (the paper's) or "concatenated"
            (Marian's), as in `PositionalEncoding`.
        output_bias: bool, a learned bias added to the tied output logits
            (Marian's `final_logits_bias`); an untied `output_projection`
            has its bias either way.
        **kwargs: base `keras.Model` arguments.

    Call arguments:
        inputs: `(source_ids, target_input_ids)`, int `(B, S)` and `(B, T)`, or a
            dict with those keys.
        training: bool, whether dropout is active.

    Returns:
        float32 `(B, T, V)` logits.

    Example:
    >>> model = Transformer.from_preset("transformer_small", vocabulary_size=100)
    >>> source = keras.ops.array([[5, 6, 7, 3, 0]])
    >>> target = keras.ops.array([[2, 5, 6, 7]])
    >>> tuple(model((source, target)).shape)
    (1, 4, 100)

    References:
        Vaswani et al., 2017, section 3 and Table 3.
    """

    def __init__(
        self,
        vocabulary_size,
        num_layers=6,
        hidden_dim=512,
        intermediate_dim=2048,
        num_heads=8,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation="relu",
        layer_norm_epsilon=1e-6,
        normalize_first=False,
        target_vocabulary_size=None,
        share_source_target_embeddings=True,
        tie_output_embeddings=True,
        learned_positions=False,
        max_positions=None,
        pad_id=0,
        bos_id=2,
        eos_id=3,
        unk_id=1,
        sinusoid_layout="interleaved",
        output_bias=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        target_vocabulary_size = target_vocabulary_size or vocabulary_size
        if share_source_target_embeddings and target_vocabulary_size != vocabulary_size:
            raise ValueError(
                "share_source_target_embeddings needs one vocabulary. Received: "
                f"vocabulary_size={vocabulary_size}, "
                f"target_vocabulary_size={target_vocabulary_size}"
            )
        self.vocabulary_size = vocabulary_size
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.activation = keras.activations.get(activation)
        self.layer_norm_epsilon = layer_norm_epsilon
        self.normalize_first = normalize_first
        self.target_vocabulary_size = target_vocabulary_size
        self.share_source_target_embeddings = share_source_target_embeddings
        self.tie_output_embeddings = tie_output_embeddings
        self.learned_positions = learned_positions
        self.max_positions = max_positions
        self.pad_id = pad_id
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.unk_id = unk_id
        self.sinusoid_layout = sinusoid_layout
        self.output_bias = output_bias
        self._create_layers()

    def _create_layers(self):
        """The embeddings, positional encodings, stacks and output layer (unbuilt)."""
        policy = self.dtype_policy
        vocabulary_size, hidden_dim = self.vocabulary_size, self.hidden_dim
        self.source_embedding = TokenEmbedding(
            vocabulary_size, hidden_dim, dtype=policy, name="source_embedding"
        )
        self.target_embedding = (
            self.source_embedding
            if self.share_source_target_embeddings
            else TokenEmbedding(
                self.target_vocabulary_size, hidden_dim, dtype=policy, name="target_embedding"
            )
        )
        self.source_positions = PositionalEncoding(
            learned=self.learned_positions,
            max_positions=self.max_positions,
            sinusoid_layout=self.sinusoid_layout,
            dtype=policy,
            name="source_positions",
        )
        self.target_positions = PositionalEncoding(
            learned=self.learned_positions,
            max_positions=self.max_positions,
            sinusoid_layout=self.sinusoid_layout,
            dtype=policy,
            name="target_positions",
        )
        self.source_dropout = keras.layers.Dropout(
            self.dropout, dtype=policy, name="source_dropout"
        )
        self.target_dropout = keras.layers.Dropout(
            self.dropout, dtype=policy, name="target_dropout"
        )
        stack_config = {
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "intermediate_dim": self.intermediate_dim,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "activation_dropout": self.activation_dropout,
            "activation": self.activation,
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "normalize_first": self.normalize_first,
            "dtype": policy,
        }
        self.encoder = Encoder(name="encoder", **stack_config)
        self.decoder = Decoder(name="decoder", **stack_config)
        self.output_projection = None
        self.logits_bias = None  # built with `output_bias` on tied logits
        if not self.tie_output_embeddings:
            self.output_projection = keras.layers.Dense(
                self.target_vocabulary_size, dtype=policy, name="output_projection"
            )

    @classmethod
    def from_preset(cls, preset, vocabulary_size, **kwargs):
        """Builds a model from a named preset, e.g. `"transformer_base"`.

        Args:
            preset: str, one of `PRESETS`.
            vocabulary_size: int, the (shared) vocabulary size.
            **kwargs: constructor arguments overriding the preset's.

        Returns:
            An unbuilt `Transformer`.
        """
        if preset not in PRESETS:
            raise ValueError(f"Unknown preset {preset!r}. Known presets: {sorted(PRESETS)}")
        return cls(vocabulary_size=vocabulary_size, **{**PRESETS[preset], **kwargs})

    def build(self, inputs_shape):
        if isinstance(inputs_shape, dict):
            inputs_shape = tuple(inputs_shape[key] for key in INPUT_KEYS)
        source_shape, target_shape = inputs_shape
        source_states = tuple(source_shape) + (self.hidden_dim,)
        target_states = tuple(target_shape) + (self.hidden_dim,)
        self.source_embedding.build(source_shape)
        if not self.target_embedding.built:  # already built when shared
            self.target_embedding.build(target_shape)
        self.source_positions.build(source_states)
        self.target_positions.build(target_states)
        self.encoder.build(source_states)
        self.decoder.build(target_states, source_states)
        if self.output_projection is not None:
            self.output_projection.build(target_states)
        if self.output_bias and self.output_projection is None:
            self.logits_bias = self.add_weight(
                name="output_bias", shape=(self.target_vocabulary_size,), initializer="zeros"
            )
        self.built = True

    def padding_mask(self, token_ids):
        """Bool `(B, L)` mask, True for tokens other than `pad_id`."""
        return ops.not_equal(token_ids, self.pad_id)

    def target_padding_mask(self, target_ids):
        """Bool `(B, T)` mask of decoder inputs: `padding_mask`, and True for the start token."""
        first = ops.equal(ops.arange(ops.shape(target_ids)[1]), 0)  # (T,)
        return ops.logical_or(self.padding_mask(target_ids), ops.expand_dims(first, 0))

    def encode(self, source_ids, training=None):
        """Encodes int `(B, S)` source ids.

        Returns:
            `(encoder_outputs, source_padding_mask)`: `(B, S, D)` and bool `(B, S)`.
        """
        source_padding_mask = self.padding_mask(source_ids)
        states = self.source_positions(self.source_embedding(source_ids))  # (B, S, D)
        states = self.source_dropout(states, training=training)
        encoder_outputs = self.encoder(states, padding_mask=source_padding_mask, training=training)
        return encoder_outputs, source_padding_mask

    def _logits(self, states, table=None):
        if self.output_projection is None:
            logits = self.target_embedding(states, reverse=True, table=table)  # (B, T, V)
            if self.logits_bias is not None:
                logits = logits + ops.cast(self.logits_bias, logits.dtype)
        else:
            logits = self.output_projection(states)  # (B, T, V)
        return ops.cast(logits, "float32")

    def _embed_target(self, target_ids, start_index=0, training=None):
        """Int `(B, T)` ids at positions `start_index, ...` -> `(B, T, D)` decoder inputs."""
        states = self.target_embedding(target_ids)  # (B, T, D)
        states = self.target_positions(states, start_index=start_index)
        return self.target_dropout(states, training=training)

    def decode(
        self,
        target_ids,
        encoder_outputs,
        source_padding_mask,
        return_attention_scores=False,
        training=None,
    ):
        """Decodes int `(B, T)` target ids against `(B, S, D)` encoder outputs.

        The whole target at once, as in training (teacher forcing); incremental
        decoding goes through `start_decoding` and `decoding_step`.

        Args:
            target_ids: int `(B, T)`, `bos_id` first, padded with `pad_id`.
            encoder_outputs: `(B, S, D)` from `encode`.
            source_padding_mask: bool `(B, S)` from `encode`.
            return_attention_scores: bool, also return the `(B, L, H, T, S)`
                encoder-decoder attention probabilities.
            training: bool, whether dropout is active.

        Returns:
            float32 `(B, T, V)` logits; with `return_attention_scores`, a pair
            of them and the attention probabilities.
        """
        results = self.decoder(
            self._embed_target(target_ids, training=training),
            encoder_outputs,
            decoder_padding_mask=self.target_padding_mask(target_ids),
            encoder_padding_mask=source_padding_mask,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        if return_attention_scores:
            return self._logits(results[0]), results[1]
        return self._logits(results)

    def start_decoding(self, source_ids, cache_length=0, return_attention=False):
        """Encodes sources once and returns the state that `decoding_step` reads.

        The state is a dict of two dicts of tensors, so that a search can carry
        it through `ops.while_loop` and take rows of it: `"source"` holds what
        every hypothesis of a sentence shares (the encoder-decoder keys and
        values, the source padding mask), `"target"` what each hypothesis owns
        (its self-attention cache). Beam search reorders `"target"` rows only.

        Args:
            source_ids: int `(B, S)` source ids, padded with `pad_id`.
            cache_length: int, 0 (the default) for self-attention caches that
                grow by one position a step; the longest output for fixed-size
                caches (static shapes, as `jax.jit` needs).
            return_attention: bool, keep each step's alignment in the state:
                `state["target"]["attention"]`, float32 `(B, S)`, the last
                layer's encoder-decoder attention averaged over heads.

        Returns:
            dict: `state["source"]["cross_attention_cache"]`, L pairs
            `(B, H, S, K)`; `state["source"]["padding_mask"]`, bool `(B, S)`;
            `state["target"]["self_attention_cache"]`, L pairs
            `(B, H, cache_length, K)`.
        """
        encoder_outputs, source_padding_mask = self.encode(source_ids)  # (B, S, D), (B, S)
        batch_size = ops.shape(source_ids)[0]
        state = {
            "source": {
                "cross_attention_cache": self.decoder.compute_cross_attention_cache(
                    encoder_outputs
                ),
                "padding_mask": source_padding_mask,
            },
            "target": {
                "self_attention_cache": self.decoder.initial_cache(batch_size, cache_length),
            },
        }
        if return_attention:
            state["target"]["attention"] = ops.zeros(ops.shape(source_ids), dtype="float32")
        return state

    def step_constants(self):
        """What every `decoding_step` of a search reads and none changes, computed once.

        An int8 tied output projection casts its `(V, D)` table here, once a
        search, instead of at every step; a float model has nothing to hoist.

        Returns:
            dict, empty or `{"output_table": (V, D) tensor}`; a search passes it
            to each `decoding_step` as `constants`.
        """
        if self.output_projection is None and self.target_embedding.quantization_mode:
            return {"output_table": self.target_embedding.output_table()}
        return {}

    def decoding_step(self, token_ids, state, index=None, normalize=True, constants=None):
        """Log-probabilities (or logits) of the next token after `token_ids`.

        Args:
            token_ids: int `(R,)`, each row's token at the current position
                (`bos_id` first).
            state: from `start_decoding`, with rows taken as the search needs.
            index: int scalar, the current position, for fixed-size caches;
                None for growing caches (the position is their length).
            normalize: bool, return log-probabilities; False returns the
                logits, for searches that change them before the softmax.
            constants: dict from `step_constants()`, computed once a search;
                None computes what it holds at this step.

        Returns:
            `(log_probs, state)`: float32 `(R, V)` and the updated state.
        """
        source, cache = state["source"], state["target"]["self_attention_cache"]
        # A growing cache's length is the current position.
        position = ops.shape(cache[0][0])[2] if index is None else index
        alignment = "attention" in state["target"]
        outputs = self.decoder.call_with_cache(
            self._embed_target(token_ids[:, None], start_index=position),
            cache,
            source["cross_attention_cache"],
            encoder_padding_mask=source["padding_mask"],
            cache_update_index=index,
            return_attention_scores=alignment,
        )  # (R, 1, D), caches[, (R, L, H, 1, S)]
        table = (constants or {}).get("output_table")
        logits = self._logits(outputs[0], table=table)[:, 0]  # (R, V)
        log_probs = ops.log_softmax(logits, axis=-1) if normalize else logits
        target = {"self_attention_cache": outputs[1]}
        if alignment:  # the last layer's, averaged over heads
            target["attention"] = ops.mean(ops.cast(outputs[2][:, -1, :, 0], "float32"), axis=1)
        return log_probs, {"source": source, "target": target}

    def call(self, inputs, training=None):
        source_ids, target_ids = _split_inputs(inputs)
        encoder_outputs, source_padding_mask = self.encode(source_ids, training=training)
        return self.decode(target_ids, encoder_outputs, source_padding_mask, training=training)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return super().from_config(renamed(config, {"max_length": "max_positions"}), custom_objects)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocabulary_size": self.vocabulary_size,
                "num_layers": self.num_layers,
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "num_heads": self.num_heads,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation_dropout": self.activation_dropout,
                "activation": keras.activations.serialize(self.activation),
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "normalize_first": self.normalize_first,
                "target_vocabulary_size": self.target_vocabulary_size,
                "share_source_target_embeddings": self.share_source_target_embeddings,
                "tie_output_embeddings": self.tie_output_embeddings,
                "learned_positions": self.learned_positions,
                "max_positions": self.max_positions,
                "pad_id": self.pad_id,
                "bos_id": self.bos_id,
                "eos_id": self.eos_id,
                "unk_id": self.unk_id,
                "sinusoid_layout": self.sinusoid_layout,
                "output_bias": self.output_bias,
            }
        )
        return config
