"""What the JAX training tests share."""

import keras

from pipelines.training.jax_trainer import JaxTrainer
from pipelines.training.run import build_model


def train_on_one_device(config, run_dir, data, **fit_arguments):
    """A run's model trained again on one device from its seed, on `data` (global batches).

    Args:
        config: the run's `TrainConfig` (its `config.json`).
        run_dir: pathlib.Path, the run's folder (its `sentencepiece.model`).
        data: the global batches, a tf.data dataset or `ProcessBatches`.
        **fit_arguments: for `JaxTrainer.fit` (`steps`, `steps_per_epoch`).

    Returns:
        `(history, model, trainer)`.
    """
    one = keras.distribution.DataParallel(devices=keras.distribution.list_devices()[:1])
    keras.utils.set_random_seed(config.optimization.seed)
    with one.scope():
        model, schedule, optimizer = build_model(config, str(run_dir / "sentencepiece.model"))
    trainer = JaxTrainer(model, optimizer, one, schedule=schedule)
    return trainer.fit(data, verbose=0, **fit_arguments), model, trainer
