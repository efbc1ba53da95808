"""Models of keras_transformer."""

from keras_transformer.models.presets import PRESETS
from keras_transformer.models.transformer import Transformer

__all__ = ["PRESETS", "Transformer"]
