import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from pipelines.training.optimizers import FusedAdam
from pipelines.training.parallel import make_strategy
from pipelines.training.trainer import Trainer
from tests.pipelines.training.test_trainer import make_batch, needs_two_cpus


def train(optimizer_class, strategy, steps=3):
    """`(trainer, per-step losses)` after `steps` mirrored steps of a tiny model."""
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = kt.Transformer(
            30, num_layers=1, hidden_dim=16, intermediate_dim=32, num_heads=2, dropout=0.0
        )
        model.build(((None, None), (None, None)))
        optimizer = optimizer_class(kt.TransformerSchedule(16, 2), beta_2=0.98, epsilon=1e-9)
    batches = [make_batch(i) for i in range(steps)]
    data = tf.data.Dataset.from_tensors(batches[0])
    for batch in batches[1:]:
        data = data.concatenate(tf.data.Dataset.from_tensors(batch))
    trainer = Trainer(model, optimizer, strategy)
    history = trainer.fit(data, steps=steps, steps_per_epoch=1, verbose=0)
    return trainer, history.history["loss"]


def fused_kernels(trainer, strategy):
    """`ResourceApplyAdam` ops in the trainer's traced update step, nested functions included."""
    data = tf.data.Dataset.from_tensors(make_batch(0))
    iterator = iter(data)  # the trainer's local stream of global batches
    graph_def = trainer._apply_function.get_concrete_function(iterator).graph.as_graph_def()
    nodes = list(graph_def.node)
    nodes += [node for function in graph_def.library.function for node in function.node_def]
    return sum(node.op == "ResourceApplyAdam" for node in nodes)


def start(shape):
    return np.linspace(-1, 1, np.prod(shape), dtype="float32").reshape(shape)


def apply_gradients(optimizer_class, strategy, gradients):
    """Variables and optimizer state after applying each list of `gradients` in turn."""
    with strategy.scope():
        variables = [keras.Variable(start(g.shape)) for g in gradients[0]]
        optimizer = optimizer_class(kt.TransformerSchedule(16, 2), beta_2=0.98, epsilon=1e-9)
        optimizer.build(variables)

    def replica_step(grads):  # each replica's own copy, summed over both
        grads = [tf.identity(g) for g in grads]
        optimizer.apply_gradients(zip(grads, variables, strict=True))

    @tf.function
    def step(grads):
        strategy.run(replica_step, args=(grads,))

    for grads in gradients:
        step([tf.constant(g) for g in grads])
    return [v.numpy() for v in variables + list(optimizer.variables)]


@needs_two_cpus
def test_fused_adam_equals_keras_adam_under_a_mirrored_strategy():
    strategy, _ = make_strategy()
    assert strategy.num_replicas_in_sync == 2
    rng = np.random.default_rng(0)
    gradients = [
        [rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(5,)).astype("float32")]
        for _ in range(4)
    ]
    expected = apply_gradients(keras.optimizers.Adam, strategy, gradients)
    actual = apply_gradients(FusedAdam, strategy, gradients)
    assert len(actual) == 2 + 1 + 2 * 2  # variables, iterations, m and v of each
    for value, reference in zip(actual, expected, strict=True):
        np.testing.assert_allclose(value, reference, rtol=1e-5, atol=1e-6)  # a few ulps
    assert not np.allclose(actual[0], start((4, 3)))
    # In the Trainer: the same losses, one fused kernel a variable and replica.
    trainer, losses = train(FusedAdam, strategy)
    reference_trainer, reference_losses = train(keras.optimizers.Adam, strategy)
    np.testing.assert_allclose(losses, reference_losses, rtol=1e-5)
    assert fused_kernels(trainer, strategy) == 2 * len(trainer.model.trainable_variables)
    assert fused_kernels(reference_trainer, strategy) == 0


def test_fused_adam_round_trips_and_refuses_amsgrad():
    optimizer = FusedAdam(1e-3, beta_2=0.98, epsilon=1e-9)
    again = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(again, FusedAdam) and again.get_config() == optimizer.get_config()
    with pytest.raises(ValueError, match="amsgrad=True"):
        FusedAdam(amsgrad=True)
