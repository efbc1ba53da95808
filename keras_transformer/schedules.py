"""The learning-rate schedule of eq. (3) and the paper's Adam settings."""

import keras
from keras import ops

from keras_transformer.layers.renames import renamed


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lrate = scale * hidden_dim^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`.

    Linear warm-up for `warmup_steps`, then decay with the inverse square root
    of the step. `step` counts from 1 as in the paper: the optimizer's
    iteration counter `i` (which starts at 0) is step `i + 1`.

    With `cooldown > 0` the rate is also multiplied by
    `min(1, (total_steps - i) / (cooldown * total_steps))`: it falls linearly
    to 0 over the last `cooldown` fraction of `total_steps` updates and is 0
    once `total_steps` updates are done (inverse square root with a cooldown,
    Zhai et al., 2022). A run that learns its length only while training (a
    time budget) calls `set_total_steps`; until then, or with `total_steps`
    of 0, there is no cooldown. `total_steps` lives in a variable, so setting
    it reaches a TensorFlow train function already traced; a compiled JAX
    step sees a new value only if it takes `variables` as inputs (through
    `keras.StatelessScope`), as the pipelines' `JaxTrainer` does.

    A run that changes its length once the cooldown has begun passes
    `set_total_steps(total_steps, (i, schedule.multiplier(i)))`: from update
    `i` on, the multiplier falls linearly from the value it had there to 0 at
    the new `total_steps`, so a longer run stretches the rest of the fall
    instead of raising the rate again, and a shorter one steepens it.

    Args:
        hidden_dim: int, model size.
        warmup_steps: int, warm-up length (4000 in the paper).
        scale: float, multiplier on the whole schedule (1.0 in the paper).
        total_steps: int or None, the updates of the whole run (with
            `cooldown`).
        cooldown: float in [0, 1], the fraction of `total_steps` over which
            the rate falls to 0. 0 (the paper) keeps eq. (3) unchanged.
        cooldown_from: `(step, multiplier)` or None: the cooldown falls
            linearly from `multiplier` at update `step` to 0 at
            `total_steps` (as `set_total_steps` takes it).

    Call arguments:
        step: int scalar, the optimizer's iteration counter (from 0).

    Returns:
        float32 scalar learning rate.

    Example:
    >>> schedule = TransformerSchedule(hidden_dim=512)
    >>> round(float(schedule(3999)), 6)
    0.000699
    >>> cooled = TransformerSchedule(512, total_steps=10000, cooldown=0.2)
    >>> float(cooled(10000)), round(float(cooled(9000) / schedule(9000)), 6)
    (0.0, 0.5)

    References:
        Vaswani et al., 2017, section 5.3 and eq. (3).
        Zhai et al., 2022, "Scaling Vision Transformers", section 3.5.
    """

    def __init__(
        self,
        hidden_dim,
        warmup_steps=4000,
        scale=1.0,
        total_steps=None,
        cooldown=0.0,
        cooldown_from=None,
    ):
        if hidden_dim <= 0:
            raise ValueError(f"hidden_dim must be positive. Received: hidden_dim={hidden_dim}")
        if warmup_steps <= 0:
            raise ValueError(
                f"warmup_steps must be positive. Received: warmup_steps={warmup_steps}"
            )
        if not 0.0 <= cooldown <= 1.0:
            raise ValueError(f"cooldown must be in [0, 1]. Received: cooldown={cooldown}")
        if total_steps is not None and total_steps < 0:
            raise ValueError(
                f"total_steps must be positive or 0. Received: total_steps={total_steps}"
            )
        self.hidden_dim = hidden_dim
        self.warmup_steps = warmup_steps
        self.scale = scale
        self.cooldown = cooldown
        self._total_steps = self._from_step = self._from_multiplier = None
        if cooldown > 0:
            self._total_steps = keras.Variable(
                float(total_steps or 0), dtype="float32", trainable=False, name="total_steps"
            )
            # Step -1: no re-planned cooldown, the fall of `cooldown * total_steps` updates.
            step, multiplier = cooldown_from if cooldown_from is not None else (-1, 1.0)
            self._from_step = keras.Variable(
                float(step), dtype="float32", trainable=False, name="cooldown_from_step"
            )
            self._from_multiplier = keras.Variable(
                float(multiplier), dtype="float32", trainable=False, name="cooldown_from_multiplier"
            )

    @property
    def total_steps(self):
        """int or None: the run's length in updates, where a cooldown uses one."""
        if self._total_steps is None:
            return None
        return int(keras.ops.convert_to_numpy(self._total_steps))

    @property
    def cooldown_from(self):
        """`(step, multiplier)` or None: where a re-planned cooldown falls from."""
        if self._from_step is None:
            return None
        step = float(ops.convert_to_numpy(self._from_step))
        return None if step < 0 else (int(step), float(ops.convert_to_numpy(self._from_multiplier)))

    @property
    def variables(self):
        """list of `keras.Variable`: what the schedule reads (`total_steps`, `cooldown_from`)."""
        if self._total_steps is None:
            return []
        return [self._total_steps, self._from_step, self._from_multiplier]

    def set_total_steps(self, total_steps, cooldown_from=None):
        """Sets the run's length in updates; the cooldown ends there.

        Args:
            total_steps: int, the run's updates.
            cooldown_from: `(step, multiplier)` or None. Given, the
                multiplier on eq. (3) falls linearly from `multiplier` at
                update `step` to 0 at `total_steps` (the same line, capped
                at 1, before `step`); pass
                `(i, schedule.multiplier(i))` to keep the rate where it is at
                update `i`. None: the plain cooldown over the last
                `cooldown * total_steps` updates.

        Raises:
            ValueError: the schedule has no cooldown, or `total_steps` < 0.
        """
        if self._total_steps is None:
            raise ValueError("set_total_steps needs a schedule with cooldown > 0")
        if total_steps < 0:
            raise ValueError(
                f"total_steps must be positive or 0. Received: total_steps={total_steps}"
            )
        step, multiplier = cooldown_from if cooldown_from is not None else (-1, 1.0)
        self._total_steps.assign(float(total_steps))
        self._from_step.assign(float(step))
        self._from_multiplier.assign(float(multiplier))

    def multiplier(self, step):
        """float: the cooldown's factor on eq. (3) at update `step` (1.0 without one)."""
        if self._total_steps is None:
            return 1.0
        return float(ops.convert_to_numpy(self._multiplier(float(step))))

    def _multiplier(self, iteration):
        # The cooldown's factor on eq. (3) at update `iteration` (float32 scalar).
        total = ops.convert_to_tensor(self._total_steps)
        start = ops.convert_to_tensor(self._from_step)
        plain = ops.clip((total - iteration) / ops.maximum(self.cooldown * total, 1.0), 0.0, 1.0)
        # The line from (start, multiplier) to (total, 0), also before `start`
        # (a run resumed from a backup older than the re-plan), capped at 1:
        # the rate falls without a jump on either side of `start`.
        stretched = ops.clip(
            ops.convert_to_tensor(self._from_multiplier)
            * (total - iteration)
            / ops.maximum(total - start, 1.0),
            0.0,
            1.0,
        )
        factor = ops.where(start >= 0, stretched, plain)
        return ops.where(total > 0, factor, 1.0)

    def __call__(self, step):
        iteration = ops.cast(step, "float32")
        step = iteration + 1.0
        rate = (
            self.scale
            * self.hidden_dim**-0.5
            * ops.minimum(ops.rsqrt(step), step * self.warmup_steps**-1.5)
        )
        if self._total_steps is None:
            return rate
        return rate * self._multiplier(iteration)

    @classmethod
    def from_config(cls, config):
        return cls(**renamed(config, {"d_model": "hidden_dim"}))

    def get_config(self):
        return {
            "hidden_dim": self.hidden_dim,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
            "total_steps": self.total_steps,
            "cooldown": self.cooldown,
            "cooldown_from": self.cooldown_from,
        }


def transformer_optimizer(
    hidden_dim, warmup_steps=4000, scale=1.0, schedule=None, optimizer_class=None, **kwargs
):
    """Adam with beta_1=0.9, beta_2=0.98, epsilon=1e-9 on `TransformerSchedule`.

    Args:
        hidden_dim: int, model size.
        warmup_steps: int, warm-up steps of the schedule.
        scale: float, multiplier on the schedule.
        schedule: a `TransformerSchedule` (with a cooldown, say) used instead
            of the one the three arguments above describe.
        optimizer_class: `keras.optimizers.Adam` (the default) or a subclass
            computing the same update (the TensorFlow pipelines' `FusedAdam`).
        **kwargs: further `keras.optimizers.Adam` arguments (e.g. `clipnorm`).

    Returns:
        An `optimizer_class` instance.

    References:
        Vaswani et al., 2017, section 5.3.
    """
    options = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, **kwargs}
    schedule = schedule or TransformerSchedule(hidden_dim, warmup_steps, scale)
    return (optimizer_class or keras.optimizers.Adam)(learning_rate=schedule, **options)
