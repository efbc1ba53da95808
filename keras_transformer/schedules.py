"""The learning-rate schedule of eq. (3) and the paper's Adam settings."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`.

    Linear warm-up for `warmup_steps`, then decay with the inverse square root
    of the step. `step` counts from 1 as in the paper: the optimizer's
    iteration counter `i` (which starts at 0) is step `i + 1`.

    Args:
        d_model: int, model size.
        warmup_steps: int, warm-up length (4000 in the paper).
        scale: float, multiplier on the whole schedule (1.0 in the paper).

    Call arguments:
        step: int scalar, the optimizer's iteration counter (from 0).

    Returns:
        float32 scalar learning rate.

    Example:
    >>> schedule = TransformerSchedule(d_model=512)
    >>> round(float(schedule(3999)), 6)
    0.000699

    References:
        Vaswani et al., 2017, section 5.3 and eq. (3).
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0:
            raise ValueError(f"d_model must be positive. Received: d_model={d_model}")
        if warmup_steps <= 0:
            raise ValueError(
                f"warmup_steps must be positive. Received: warmup_steps={warmup_steps}"
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        return (
            self.scale
            * self.d_model**-0.5
            * ops.minimum(ops.rsqrt(step), step * self.warmup_steps**-1.5)
        )

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}


def transformer_optimizer(d_model, warmup_steps=4000, scale=1.0, **kwargs):
    """Adam with beta_1=0.9, beta_2=0.98, epsilon=1e-9 on `TransformerSchedule`.

    Args:
        d_model: int, model size.
        warmup_steps: int, warm-up steps of the schedule.
        scale: float, multiplier on the schedule.
        **kwargs: further `keras.optimizers.Adam` arguments (e.g. `clipnorm`).

    Returns:
        A `keras.optimizers.Adam`.

    References:
        Vaswani et al., 2017, section 5.3.
    """
    options = {"beta_1": 0.9, "beta_2": 0.98, "epsilon": 1e-9, **kwargs}
    return keras.optimizers.Adam(
        learning_rate=TransformerSchedule(d_model, warmup_steps, scale), **options
    )
