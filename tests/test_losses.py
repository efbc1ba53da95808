import keras
import numpy as np
import pytest

from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy
from tests.test_case import gradient, to_numpy

LABELS = np.array([[1, 2, 0], [3, 0, 0]])
LOGITS = np.random.default_rng(0).normal(size=(2, 3, 4)).astype("float32")


def hand_computed(labels, logits, epsilon, pad_id=0):
    total, count = 0.0, 0
    for b in range(labels.shape[0]):
        for t in range(labels.shape[1]):
            if labels[b, t] == pad_id:
                continue
            z = logits[b, t].astype("float64")
            log_p = z - np.log(np.exp(z).sum())
            q = np.full(len(z), epsilon / len(z))
            q[labels[b, t]] += 1.0 - epsilon
            total += -(q * log_p).sum()
            count += 1
    return total / count


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_equals_hand_computation(epsilon):
    loss = LabelSmoothedCrossEntropy(label_smoothing=epsilon, pad_id=0)
    np.testing.assert_allclose(
        float(loss(LABELS, LOGITS)), hand_computed(LABELS, LOGITS, epsilon), rtol=1e-5
    )


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_gradient_is_softmax_minus_smoothed_target(epsilon):
    # d loss / d z = (softmax(z) - q) / tokens at real positions, 0 at pads.
    loss = LabelSmoothedCrossEntropy(label_smoothing=epsilon, pad_id=0)
    z = LOGITS.astype("float64")
    q = np.full(z.shape, epsilon / z.shape[-1])
    q += (1.0 - epsilon) * np.eye(z.shape[-1])[LABELS]
    real = (LABELS != 0)[..., None]
    softmax = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    expected = np.where(real, softmax - q, 0.0) / real.sum()
    computed = gradient(lambda logits: loss(LABELS, logits), LOGITS)
    np.testing.assert_allclose(computed, expected, atol=1e-6)


def test_without_smoothing_equals_keras_cross_entropy_on_real_tokens():
    loss = LabelSmoothedCrossEntropy(label_smoothing=0.0)
    real = LABELS != 0
    reference = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    np.testing.assert_allclose(
        float(loss(LABELS, LOGITS)), float(reference(LABELS[real], LOGITS[real])), rtol=1e-5
    )


def test_padding_does_not_change_the_value():
    loss = LabelSmoothedCrossEntropy()
    padded_labels = np.pad(LABELS, ((0, 0), (0, 4)))
    padded_logits = np.pad(LOGITS, ((0, 0), (0, 4), (0, 0)), constant_values=3.0)
    np.testing.assert_allclose(
        float(loss(padded_labels, padded_logits)), float(loss(LABELS, LOGITS)), rtol=1e-6
    )


def test_loss_and_metric_serialize():
    for obj in (LabelSmoothedCrossEntropy(label_smoothing=0.2, pad_id=1), MaskedAccuracy(pad_id=1)):
        revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(obj))
        assert revived.get_config() == obj.get_config()


def test_masked_accuracy_ignores_pads():
    metric = MaskedAccuracy(pad_id=0)
    predictions = np.eye(4)[[[1, 3, 0], [3, 1, 1]]]  # argmax: [[1,3,0],[3,1,1]]
    metric.update_state(LABELS, predictions)
    # Real tokens: (1 ok), (2 wrong), (3 ok) -> 2/3; pad positions ignored.
    np.testing.assert_allclose(float(to_numpy(metric.result())), 2 / 3, rtol=1e-6)
    with pytest.raises(ValueError, match="label_smoothing=1.0"):
        LabelSmoothedCrossEntropy(label_smoothing=1.0)
