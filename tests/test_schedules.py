import json

import keras
import numpy as np
import pytest

from keras_transformer import TransformerSchedule, transformer_optimizer


def eq_3(step_num, hidden_dim, warmup_steps):
    return hidden_dim**-0.5 * min(step_num**-0.5, step_num * warmup_steps**-1.5)


@pytest.mark.parametrize("iteration", [0, 1, 99, 3999, 4000, 10000, 100000])
def test_equals_eq_3(iteration):
    schedule = TransformerSchedule(hidden_dim=512, warmup_steps=4000)
    # The optimizer counts iterations from 0; the paper counts steps from 1.
    np.testing.assert_allclose(
        float(schedule(iteration)), eq_3(iteration + 1, 512, 4000), rtol=1e-6
    )


def test_peaks_at_the_end_of_warmup_and_scales():
    schedule = TransformerSchedule(hidden_dim=256, warmup_steps=100, scale=2.0)
    rates = [float(schedule(i)) for i in range(300)]
    assert int(np.argmax(rates)) == 99
    np.testing.assert_allclose(rates[99], 2.0 * 256**-0.5 * 100**-0.5, rtol=1e-6)


def test_serializable():
    schedule = TransformerSchedule(hidden_dim=128, warmup_steps=10, scale=0.5)
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert revived.get_config() == schedule.get_config()
    assert float(revived(5)) == float(schedule(5))


def test_optimizer_uses_the_paper_adam_settings():
    optimizer = transformer_optimizer(512, clipnorm=1.0)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert optimizer.clipnorm == 1.0
    assert isinstance(optimizer._learning_rate, TransformerSchedule)
    # Keras's own Adam (a backend subclass under torch), not a subclass of ours.
    assert type(optimizer) is type(keras.optimizers.Adam())

    class Subclass(keras.optimizers.Adam):
        pass

    optimizer = transformer_optimizer(512, optimizer_class=Subclass)
    assert isinstance(optimizer, Subclass) and optimizer.beta_2 == 0.98


def test_invalid_arguments():
    with pytest.raises(ValueError, match="warmup_steps=0"):
        TransformerSchedule(hidden_dim=8, warmup_steps=0)


@pytest.mark.parametrize("iteration", [0, 399, 799, 800, 900, 999, 1000, 1200])
def test_cooldown_falls_linearly_to_zero_at_total_steps(iteration):
    schedule = TransformerSchedule(64, warmup_steps=100, total_steps=1000, cooldown=0.2)
    # The last 200 of 1000 updates scale eq. (3) by (1000 - i) / 200, down to 0.
    factor = min(1.0, max(0.0, (1000 - iteration) / 200))
    np.testing.assert_allclose(
        float(schedule(iteration)), factor * eq_3(iteration + 1, 64, 100), rtol=1e-5, atol=1e-12
    )


def test_total_steps_set_later_moves_the_cooldown():
    schedule = TransformerSchedule(64, warmup_steps=100, cooldown=0.5)
    plain = TransformerSchedule(64, warmup_steps=100)
    assert schedule.total_steps == 0 and float(schedule(900)) == float(plain(900))
    schedule.set_total_steps(1000)
    assert schedule.total_steps == 1000 and float(schedule(1000)) == 0.0
    np.testing.assert_allclose(float(schedule(750)), 0.5 * float(plain(750)), rtol=1e-6)
    revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert revived.get_config() == schedule.get_config() and revived.total_steps == 1000
    with pytest.raises(ValueError, match="cooldown > 0"):
        plain.set_total_steps(10)
    with pytest.raises(ValueError, match="cooldown=1.5"):
        TransformerSchedule(64, cooldown=1.5)


def test_a_replanned_cooldown_falls_on_from_where_it_is():
    schedule = TransformerSchedule(64, warmup_steps=100, total_steps=1000, cooldown=0.5)
    plain = TransformerSchedule(64, warmup_steps=100)
    # At update 800 the plain fall (from 500 to 1000) has reached 0.4; the run
    # now lasts 1,400 updates: 0.4 falls linearly to 0 at 1,400.
    multiplier = schedule.multiplier(800)
    np.testing.assert_allclose(multiplier, 0.4, rtol=1e-6)
    schedule.set_total_steps(1400, (800, multiplier))
    assert schedule.cooldown_from == (800, pytest.approx(0.4))
    # Before 800 (a run resumed from an older backup) the same line, capped at 1.
    for iteration in (0, 700, 800, 900, 1100, 1399, 1400, 1500):
        factor = min(1.0, 0.4 * max(0.0, (1400 - iteration) / 600))
        np.testing.assert_allclose(
            float(schedule(iteration)), factor * float(plain(iteration)), rtol=1e-5, atol=1e-12
        )
    config = json.loads(json.dumps(keras.saving.serialize_keras_object(schedule)))
    revived = keras.saving.deserialize_keras_object(config)  # a list, read back from JSON
    assert revived.cooldown_from == schedule.cooldown_from
    np.testing.assert_allclose(float(revived(1100)), float(schedule(1100)), rtol=1e-6)
    # A plain plan again drops the re-planned fall.
    schedule.set_total_steps(1000)
    assert schedule.cooldown_from is None and schedule.multiplier(750) == pytest.approx(0.5)
    assert plain.multiplier(750) == 1.0


def test_variables_are_the_state_it_reads():
    assert TransformerSchedule(64).variables == []
    schedule = TransformerSchedule(64, warmup_steps=100, total_steps=1000, cooldown=0.5)
    total_steps, from_step, from_multiplier = schedule.variables
    # A stateless step that maps the variables sees the mapped run length and fall.
    with keras.StatelessScope(state_mapping=[(total_steps, keras.ops.convert_to_tensor(750.0))]):
        assert float(schedule(750)) == 0.0
    assert float(schedule(750)) > 0.0
    plain = TransformerSchedule(64, warmup_steps=100)
    mapping = [(from_step, 600.0), (from_multiplier, 0.25)]
    with keras.StatelessScope(
        state_mapping=[(v, keras.ops.convert_to_tensor(x)) for v, x in mapping]
    ):
        # From (600, 0.25) down to 0 at 1,000: 0.125 at 800.
        np.testing.assert_allclose(float(schedule(800)), 0.125 * float(plain(800)), rtol=1e-5)
    assert schedule.cooldown_from is None
