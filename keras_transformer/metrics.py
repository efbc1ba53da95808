"""Token accuracy over real (non-pad) tokens."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Metric):
    """Fraction of real target tokens whose arg-max prediction is right.

    Tokens whose label equals `pad_id` are ignored.

    Args:
        pad_id: int or None, label id to ignore.
        name: str, metric name.
        **kwargs: base `keras.metrics.Metric` arguments.

    Call arguments (`update_state`):
        y_true: int `(B, T)` target ids.
        y_pred: float `(B, T, V)` logits or probabilities.
        sample_weight: optional `(B, T)` weights.

    Returns:
        float32 scalar from `result()`.

    Example:
    >>> metric = MaskedAccuracy(pad_id=0)
    >>> metric.update_state([[1, 0]], [[[0.0, 1.0], [1.0, 0.0]]])
    >>> float(metric.result())
    1.0
    """

    def __init__(self, pad_id=0, name="masked_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        predictions = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        weights = ops.ones(ops.shape(y_true), dtype="float32")
        if self.pad_id is not None:
            weights = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        if sample_weight is not None:
            weights = weights * ops.cast(sample_weight, "float32")
        matches = ops.cast(ops.equal(y_true, predictions), "float32")
        self.correct.assign_add(ops.sum(matches * weights))
        self.count.assign_add(ops.sum(weights))

    def result(self):
        return self.correct / ops.maximum(self.count, 1.0)

    def get_config(self):
        config = super().get_config()
        config["pad_id"] = self.pad_id
        return config
