"""Label-smoothed cross-entropy over real (non-pad) tokens."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Cross-entropy against label-smoothed targets, averaged over real tokens.

    The target distribution is `(1 - label_smoothing) * one_hot(y) +
    label_smoothing / V`, the form of Keras' categorical cross-entropy (section
    5.4 uses `label_smoothing = 0.1`). Positions whose label equals `pad_id`
    count neither in the sum nor in the number of tokens it is divided by, so
    the value does not depend on how much padding a batch carries.

    Args:
        label_smoothing: float in [0, 1).
        pad_id: int or None, label id to ignore.
        name: str, loss name.
        **kwargs: base `keras.losses.Loss` arguments (`reduction`, `dtype`).

    Call arguments:
        y_true: int `(B, T)` target ids.
        y_pred: float `(B, T, V)` logits.

    Returns:
        float32 scalar: mean loss per real token.

    Example:
    >>> loss = LabelSmoothedCrossEntropy(label_smoothing=0.1, pad_id=0)
    >>> value = loss(keras.ops.array([[1, 0]]), keras.ops.zeros((1, 2, 4)))
    >>> round(float(value), 4)
    1.3863

    References:
        Vaswani et al., 2017, section 5.4; Szegedy et al., 2016.
    """

    def __init__(
        self, label_smoothing=0.1, pad_id=0, name="label_smoothed_cross_entropy", **kwargs
    ):
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(
                f"label_smoothing must be in [0, 1). Received: label_smoothing={label_smoothing}"
            )
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        loss_sum, tokens = self.token_sums(y_true, y_pred)
        return loss_sum / ops.maximum(tokens, 1.0)

    def token_sums(self, y_true, y_pred):
        """The summed loss and the number of real tokens, before dividing.

        Distributed training and gradient accumulation divide sums gathered over
        replicas and micro-batches by the total token count, which gives the
        mean over every token of the global batch.

        Args:
            y_true: int `(B, T)` target ids.
            y_pred: float `(B, T, V)` logits.

        Returns:
            `(loss_sum, tokens)`, float32 scalars.
        """
        y_true = ops.cast(y_true, "int32")
        # With log p = z - logsumexp(z), the smoothed cross-entropy is
        # logsumexp(z) - (1 - eps) z[y] - eps mean(z): reductions of the
        # logits z, with no (B, T, V) array of log-probabilities. z[y] is
        # picked by a comparison with the vocabulary's indices rather than
        # gathered: the gradient of a gather scatters into a fresh (B, T, V)
        # array, that of a selection fuses with the softmax's (faster for the
        # output layer and loss together; benchmarks/studies/jax-backend.md).
        logits = ops.cast(y_pred, "float32")  # (B, T, V)
        vocabulary = ops.arange(ops.shape(logits)[-1], dtype="int32")  # (V,)
        is_target = ops.equal(vocabulary, ops.expand_dims(y_true, -1))  # (B, T, V)
        target_logits = ops.sum(ops.where(is_target, logits, 0.0), axis=-1)  # (B, T)
        losses = (
            ops.logsumexp(logits, axis=-1)
            - (1.0 - self.label_smoothing) * target_logits
            - self.label_smoothing * ops.mean(logits, axis=-1)
        )  # (B, T)
        weights = ops.ones_like(losses)
        if self.pad_id is not None:
            weights = ops.cast(ops.not_equal(y_true, self.pad_id), "float32")
        return ops.sum(losses * weights), ops.sum(weights)

    def get_config(self):
        config = super().get_config()
        config.update({"label_smoothing": self.label_smoothing, "pad_id": self.pad_id})
        return config
