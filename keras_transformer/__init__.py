"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017) for Keras 3.

Every layer uses `keras.ops` only and runs on any Keras backend.

Shape letters used in docstrings and comments:
    B batch, S source length, T target length, D model size (`d_model`),
    H heads, K head size (`d_k`), V vocabulary, L layers.

Masks:
    padding mask: bool `(B, S)`, True for a real token.
    attention mask: bool `(B, T, S)`, True where a query may attend a key.
"""

from keras_transformer.decoding import (
    DecodingControls,
    beam_search,
    greedy_search,
    length_penalty,
    sample,
    score_hypotheses,
)
from keras_transformer.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    MultiHeadAttention,
    PositionalEncoding,
    TokenEmbedding,
)
from keras_transformer.losses import LabelSmoothedCrossEntropy
from keras_transformer.metrics import MaskedAccuracy
from keras_transformer.models import PRESETS, Transformer
from keras_transformer.schedules import TransformerSchedule, transformer_optimizer

__version__ = "0.2.0"

__all__ = [
    "PRESETS",
    "DecodingControls",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
    "Transformer",
    "TransformerSchedule",
    "beam_search",
    "greedy_search",
    "length_penalty",
    "sample",
    "score_hypotheses",
    "transformer_optimizer",
]
