"""`model.fit` learns a small task well enough to decode unseen inputs exactly."""

import keras
import numpy as np
import pytest

from keras_transformer import (
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    Transformer,
    beam_search,
    greedy_search,
    score_hypotheses,
    transformer_optimizer,
)
from tests.test_case import to_numpy

PAD, BOS, EOS, FIRST_SYMBOL, VOCABULARY = 0, 2, 3, 4, 14
MAX_LENGTH = 6


def reversal_examples(count, seed):
    """Source: random symbols then pads; target: the symbols reversed, then EOS."""
    rng = np.random.default_rng(seed)
    source = np.zeros((count, MAX_LENGTH), "int32")
    target = np.zeros((count, MAX_LENGTH + 2), "int32")
    for row in range(count):
        length = rng.integers(2, MAX_LENGTH + 1)
        symbols = rng.integers(FIRST_SYMBOL, VOCABULARY, size=length)
        source[row, :length] = symbols
        target[row, 0] = BOS
        target[row, 1 : length + 1] = symbols[::-1]
        target[row, length + 1] = EOS
    return (source, target[:, :-1]), target[:, 1:]


# Keras trains eagerly under PyTorch (minutes for this fit): there it runs
# with the slow checks (make test-slow).
slow_under_torch = (
    pytest.mark.slow if keras.backend.backend() == "torch" else pytest.mark.usefixtures()
)


@slow_under_torch
def test_fit_learns_to_reverse_unseen_sequences():
    (source, target_in), target_out = reversal_examples(4096, seed=0)
    (test_source, _), test_out = reversal_examples(64, seed=1)
    seen = {tuple(row) for row in source}
    held_out = np.array([tuple(row) not in seen for row in test_source])
    assert held_out.sum() > 32

    keras.utils.set_random_seed(0)
    model = Transformer(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        hidden_dim=64,
        intermediate_dim=128,
        num_heads=4,
        dropout=0.0,
        pad_id=PAD,
        bos_id=BOS,
        eos_id=EOS,
    )
    model.compile(
        optimizer=transformer_optimizer(64, warmup_steps=200, scale=0.5),
        loss=LabelSmoothedCrossEntropy(label_smoothing=0.1, pad_id=PAD),
        metrics=[MaskedAccuracy(pad_id=PAD)],
    )
    history = model.fit((source, target_in), target_out, batch_size=64, epochs=24, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]
    assert history.history["masked_accuracy"][-1] > 0.97

    decoded = to_numpy(greedy_search(model, test_source, max_output_length=MAX_LENGTH + 1))
    exact = np.all(decoded == test_out, axis=1)
    assert exact[held_out].mean() >= 0.95, f"exact on held-out: {exact[held_out].mean():.3f}"

    # Beam search finds hypotheses at least as likely under the model as greedy's.
    beam, beam_scores = beam_search(model, test_source, beam_size=4, alpha=0.6)
    greedy_scores = to_numpy(score_hypotheses(model, test_source, decoded, alpha=0.6))
    beam_scores = to_numpy(beam_scores)[:, 0]
    assert np.all(beam_scores >= greedy_scores - 1e-5)
    beam_exact = np.all(to_numpy(beam)[:, 0, : MAX_LENGTH + 1] == test_out, axis=1)
    assert beam_exact[held_out].mean() >= exact[held_out].mean()
