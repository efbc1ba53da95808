"""Public layers of keras_transformer."""

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.decoder import Decoder, DecoderLayer
from keras_transformer.layers.embedding import TokenEmbedding
from keras_transformer.layers.encoder import Encoder, EncoderLayer
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.positional_encoding import PositionalEncoding

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "PositionalEncoding",
    "TokenEmbedding",
]
