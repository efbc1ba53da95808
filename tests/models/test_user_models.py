"""The layers inside a user's own subclassed model: fit, save and reload."""

import os

import keras
import numpy as np

from keras_transformer.layers import Encoder, PositionalEncoding, TokenEmbedding
from tests.test_case import to_numpy


@keras.saving.register_keras_serializable(package="tests")
class SequenceClassifier(keras.Model):
    def __init__(self, vocabulary_size, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.vocabulary_size = vocabulary_size
        self.hidden_dim = hidden_dim
        self.embedding = TokenEmbedding(vocabulary_size, hidden_dim, pad_id=0)
        self.positions = PositionalEncoding()
        self.encoder = Encoder(num_layers=1, num_heads=2, intermediate_dim=16, dropout=0.0)
        self.head = keras.layers.Dense(2)

    def call(self, ids):
        mask = keras.ops.not_equal(ids, 0)
        states = self.encoder(self.positions(self.embedding(ids)), padding_mask=mask)
        weights = keras.ops.expand_dims(keras.ops.cast(mask, states.dtype), -1)
        pooled = keras.ops.sum(states * weights, axis=1) / keras.ops.sum(weights, axis=1)
        return self.head(pooled)

    def get_config(self):
        return {
            **super().get_config(),
            "vocabulary_size": self.vocabulary_size,
            "hidden_dim": self.hidden_dim,
        }


def test_subclassed_user_model_learns_and_round_trips(tmp_path):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 10, size=(256, 6))
    ids[:, 4:] *= rng.integers(0, 2, size=(256, 1))  # some rows padded
    labels = (ids == 7).any(axis=1).astype("int32")  # does token 7 occur?
    model = SequenceClassifier(vocabulary_size=10, hidden_dim=8)
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    history = model.fit(ids, labels, batch_size=32, epochs=15, verbose=0)
    assert history.history["accuracy"][-1] > 0.9

    path = os.path.join(tmp_path, "classifier.keras")
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    np.testing.assert_array_equal(to_numpy(restored(ids)), to_numpy(model(ids)))
