"""Adam with one TensorFlow kernel per variable update, for the TensorFlow pipelines."""

import keras
import tensorflow as tf


def _handle(variable):
    """The resource handle of a Keras or TensorFlow variable (per device under a strategy)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
    """`keras.optimizers.Adam` whose per-variable update is one `ResourceApplyAdam` kernel.

    Keras's Adam updates each variable with about twenty small ops (casts,
    the bias-correction powers, the two moments, the step). On a CPU their
    dispatch adds up over a Transformer's ~180 variables; TensorFlow's fused
    kernel computes the same update in one op:

        m = beta_1 m + (1 - beta_1) g,    v = beta_2 v + (1 - beta_2) g^2,
        variable -= lr sqrt(1 - beta_2^t) / (1 - beta_1^t) m / (sqrt(v) + epsilon).

    It holds the same variables and config as `keras.optimizers.Adam`, so
    weights and optimizer state move between the two; a `.keras` file of a
    model compiled with it names `FusedAdam`, so load such a file with
    `compile=False` where this module is not imported. TensorFlow backend
    only; `amsgrad` is not supported.

    Args:
        *args, **kwargs: as `keras.optimizers.Adam`.

    Example:
    >>> optimizer = FusedAdam(1e-3, beta_2=0.98, epsilon=1e-9)
    >>> variable = keras.Variable([1.0, 2.0])
    >>> optimizer.apply([tf.constant([0.5, -0.5])], [variable])
    >>> [round(float(x), 4) for x in variable.numpy()]
    [0.999, 2.001]

    References:
        Kingma and Ba, 2015, Algorithm 1 (the "more efficient" ordering of
        section 2); Vaswani et al., 2017, section 5.3.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.amsgrad:
            raise ValueError("FusedAdam does not implement amsgrad. Received: amsgrad=True")

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable),
            m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype),
            beta1=beta_1,
            beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),  # dense, as Adam's update
        )
