"""One training run from a `TrainConfig`: data, vocabulary, model, fit, save."""

import contextlib
import dataclasses
import logging
import os
import shutil
import sys
import time

import keras

import keras_transformer as kt
from pipelines.data import tokenizer
from pipelines.errors import ConfigError
from pipelines.files import atomic_output, run_folder_lock, write_json
from pipelines.training import chief, data
from pipelines.training.backup import RunBackup, backup_folders
from pipelines.training.budget import TimeBudget
from pipelines.training.callbacks import (
    BestCheckpoint,
    Checkpoints,
    ResumableEarlyStopping,
    save_weights_checkpoint,
)
from pipelines.training.checkpoints import (
    average_checkpoints,
    checkpoints_to_average,
    epoch_checkpoints,
    load_checkpoint,
)
from pipelines.training.heldout import heldout_pairs, heldout_scores, validation_scorer
from pipelines.training.identity import stream_settings
from pipelines.training.init_from import find_source, load_source_weights, source_model_arguments
from pipelines.training.loop import optimizer_steps
from pipelines.training.parallel import chief_by_environment, jax_parallel, tensorflow_parallel
from pipelines.training.progress import ProgressLines
from pipelines.training.trainer import NORM_EVERY

logger = logging.getLogger(__name__)

# The step limit of a run that only a time budget ends.
UNLIMITED_STEPS = 10**9


def _callbacks(config, out_dir, is_chief, clock, schedule, trainer):
    output = config.output
    # The checkpoints averaging reads are always among those kept.
    keep = output.keep_checkpoints and max(output.keep_checkpoints, output.average_last)
    folder = os.path.join(out_dir, "checkpoints")
    callbacks = [keras.callbacks.TerminateOnNaN()]
    if is_chief:
        callbacks += [
            Checkpoints(folder, output.checkpoint_minutes, keep),
            keras.callbacks.TensorBoard(os.path.join(out_dir, "logs"), update_freq=NORM_EVERY),
        ]
    if config.budget.max_minutes:
        progbar = keras.callbacks.ProgbarLogger() if is_chief and _terminal() else None
        budget = TimeBudget(
            config.budget.max_minutes,
            0.0,
            config.budget.reserve_minutes,
            schedule if config.optimization.cooldown else None,
            max_steps=config.optimization.steps,
            plan_path=os.path.join(out_dir, "budget.json"),
            clock=clock,
            progbar=progbar,
        )
        callbacks += [budget] if progbar is None else [progbar, budget]
    if is_chief and not _terminal():
        budget = callbacks[-1] if config.budget.max_minutes else None
        callbacks.append(
            ProgressLines(lambda: budget.total_steps if budget else config.optimization.steps)
        )
    monitor = {
        "monitor": f"val_{output.metric}",
        "mode": "min" if output.metric == "loss" else "max",
        "min_delta": output.min_improvement,
    }
    if is_chief:
        callbacks.append(BestCheckpoint(folder, weights=trainer.ema_weights, **monitor))
    if output.early_stopping_patience:
        callbacks.append(ResumableEarlyStopping(patience=output.early_stopping_patience, **monitor))
    return callbacks


def _terminal():
    """Whether stdout is a terminal: the progress bar there, plain lines in a file."""
    return sys.stdout.isatty()


def build_model(config, spm_path):
    """The run's `Transformer`, learning-rate schedule and optimizer, as `config` sets them.

    Call it under the run's strategy or distribution scope, after
    `keras.utils.set_random_seed(config.optimization.seed)`: the same seed
    gives the same initial weights. With `model.init_from` the weights are
    the source model's.

    Args:
        config: a `TrainConfig`.
        spm_path: str, the run's SentencePiece model (vocabulary size, special ids).

    Returns:
        `(model, schedule, optimizer)`: a built `Transformer`, its
        `TransformerSchedule` and the optimizer on it.
    """
    arguments = config.model_arguments(
        tokenizer.vocabulary_size(spm_path), tokenizer.special_ids(spm_path)
    )
    source = find_source(config.model.init_from) if config.model.init_from else None
    if source:  # the source's own arguments (an imported model's options too), its weights
        arguments = source_model_arguments(source, arguments)
        grown = tokenizer.vocabulary_size(spm_path)  # larger with extend_vocabulary
        if grown != arguments["vocabulary_size"]:  # a joint vocabulary: only those grow
            if not config.batching.extend_vocabulary or grown < arguments["vocabulary_size"]:
                raise ConfigError(
                    f"init_from: {spm_path} has {grown} pieces and {source.model} "
                    f"{arguments['vocabulary_size']}: not the source's vocabulary"
                )
            arguments.update(vocabulary_size=grown, target_vocabulary_size=grown)
    model = kt.Transformer(**arguments)
    model.build(((None, None), (None, None)))
    if source:  # a resumed run's backup is restored over these later
        load_source_weights(model, source, spm_path)
    # With a time budget the run's length is known only once steps are
    # timed: `TimeBudget` sets the schedule's total then.
    schedule = kt.TransformerSchedule(
        model.hidden_dim,
        config.optimization.warmup_steps,
        config.optimization.learning_rate_scale,
        total_steps=None if config.budget.max_minutes else config.optimization.steps,
        cooldown=config.optimization.cooldown,
    )
    ema = config.optimization.ema
    options = {"use_ema": True, "ema_momentum": ema} if ema else {}
    optimizer = kt.transformer_optimizer(model.hidden_dim, schedule=schedule, **options)
    if config.optimization.mixed_precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return model, schedule, optimizer


def run_training(config):
    """Trains as configured; writes the outputs listed in `kt train --help`.

    Runs on the TensorFlow backend (tf.distribute) or the JAX backend
    (`keras.distribution.DataParallel`), with the same steps and outputs.

    Returns:
        dict of results: steps, final losses, validation BLEU, paths.
    """
    folder = config.output.output_dir
    is_chief = chief_by_environment()
    with run_folder_lock(folder, "output_dir") if is_chief else contextlib.nullcontext():
        if is_chief:
            _refuse_restart_of_finished_run(folder)
        return _run_training(config)


def _refuse_restart_of_finished_run(folder):
    """Refuses to train from step 0 over a finished run whose backup is gone.

    A finished run keeps its last backup, so a rerun with more steps goes
    on from there; without it a rerun would start over and replace the
    finished model.
    """
    if os.path.exists(os.path.join(folder, "result.json")) and not backup_folders(
        os.path.join(folder, "backup")
    ):
        raise ConfigError(
            f"output_dir {folder} holds a finished run with no backup to continue from "
            "(backup/ was removed, or an earlier version wrote it): a rerun would start over "
            "and replace its model.keras; train into a new output_dir, or --init-from it"
        )


def _run_training(config):
    started = time.perf_counter()
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise ConfigError(f"kt train needs KERAS_BACKEND=tensorflow or jax, not {backend}")
    if chief_by_environment():
        chief.clear_marks(config.output.output_dir)
    parallel = jax_parallel(config) if backend == "jax" else tensorflow_parallel(config)
    worker = parallel.worker
    out_dir = (
        config.output.output_dir
        if worker == 0
        else os.path.join(config.output.output_dir, "workers", f"worker-{worker}")
    )
    chief_dir = config.output.output_dir
    if worker == 0:
        # The data is checked before config.json is written: a corpus that
        # fails to load (an unknown TFDS name, a bad line) leaves no file behind.
        train, validation, heldout = data.prepare_data(config, out_dir, parallel.workers)
    else:
        train, validation, heldout = data.wait_for_data(chief_dir, out_dir)
    validation_pairs, test_pairs = heldout
    train_dir = os.path.join(chief_dir, "data", "train")
    # The input streams the chief planned the shards for (unset: from its cores), recorded.
    streams = data.planned_streams(train_dir)
    config = dataclasses.replace(
        config, batching=dataclasses.replace(config.batching, input_streams=streams)
    )
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "config.json"), config.to_dict())
    spm_path = os.path.join(out_dir, "sentencepiece.model")
    validation_dir = os.path.join(chief_dir, "data", "validation")
    validation_data = None
    if validation is not None:
        validation_data = parallel.validation_data(validation, validation_dir)

    if config.optimization.mixed_precision:
        keras.mixed_precision.set_dtype_policy(config.optimization.mixed_precision)
    keras.utils.set_random_seed(config.optimization.seed)
    with parallel.scope():
        model, schedule, optimizer = build_model(config, spm_path)
    logger.info("Model: %s parameters", f"{model.count_params():,}")
    trainer = parallel.trainer(model, optimizer, schedule)
    trainer.started = started
    backup_dirs = [os.path.join(chief_dir, "backup")] + [
        os.path.join(chief_dir, "workers", f"worker-{index}", "backup")
        for index in range(1, parallel.workers)
    ]
    backup = RunBackup(
        backup_dirs[worker],
        config.output.backup_every,
        stream_settings=stream_settings(config),
        peers=backup_dirs[:worker] + backup_dirs[worker + 1 :],
    )
    seed = backup.choose_data_seed(config.optimization.seed)
    history = trainer.fit(
        parallel.train_data(config, train, train_dir, seed),
        steps=config.optimization.steps or UNLIMITED_STEPS,
        steps_per_epoch=config.optimization.steps_per_epoch,
        callbacks=_callbacks(
            config, out_dir, worker == 0, parallel.clock(started), schedule, trainer
        ),
        validation_data=validation_data,
        verbose=1 if worker == 0 and _terminal() else 0,
        backup=backup,
        validation_scores=validation_scorer(config, out_dir, validation_pairs),
    )
    seconds = {
        "started": started,
        "trained": time.perf_counter() - started,
        "to_first_step": trainer.first_step_time and trainer.first_step_time - started,
        "validation": trainer.validation_seconds,
        "backup": sum(backup.save_seconds),
    }
    return _finish(config, out_dir, trainer, history, validation_pairs, test_pairs, seconds)


def _final_model(config, out_dir, trainer):
    """Writes `model.keras` as `output.select` says; returns the model it holds.

    The trainer's own model where `model.keras` holds its current weights,
    else a model loaded from the file.
    """
    model, output = trainer.model, config.output
    model_path = os.path.join(out_dir, "model.keras")
    folder = os.path.join(out_dir, "checkpoints")
    best = os.path.join(folder, "best.keras")
    if output.select == "best":
        if os.path.exists(best):
            logger.info("model.keras: the best checkpoint by validation %s", output.metric)
            with atomic_output(model_path, suffix=".keras") as staging:
                shutil.copyfile(best, staging)
            return load_checkpoint(model_path)
        logger.warning("select best: no validation kept a best checkpoint; averaging instead")
    if output.select == "ema":
        logger.info("model.keras: the moving average of the weights")
        with trainer.ema_weights():
            save_weights_checkpoint(model, model_path)
        return load_checkpoint(model_path)
    chosen = checkpoints_to_average(epoch_checkpoints(folder), output)
    if len(chosen) > 1:
        logger.info("Averaging %d checkpoints", len(chosen))
        return average_checkpoints(chosen, model_path)
    save_weights_checkpoint(model, model_path)
    return model


def _finish(config, out_dir, trainer, history, validation_pairs, test_pairs, seconds):
    spm_path = os.path.join(out_dir, "sentencepiece.model")
    model_path = os.path.join(out_dir, "model.keras")
    model = _final_model(config, out_dir, trainer)
    result = {
        "steps": optimizer_steps(trainer.optimizer),
        "final_learning_rate": trainer.learning_rate(),
        "resumed_at_step": trainer.initial_step,
        "history": {k: [round(float(x), 5) for x in v] for k, v in history.history.items()},
        "model": model_path,
        "sentencepiece_model": spm_path,
    }
    evaluation, split = heldout_pairs(config, validation_pairs, test_pairs)
    if isinstance(evaluation, list) and evaluation:
        if trainer.spans_processes and model is trainer.model:
            # Its weights live in every process: process 0 decodes alone, on a copy of its own.
            model = keras.saving.load_model(model_path)
        result.update(heldout_scores(config, out_dir, model, evaluation, split))
    # This process's wall-clock time to the end of training, and with evaluation included
    # (not earlier runs resumed from).
    result["training_seconds"] = round(seconds["trained"], 1)
    if seconds["to_first_step"] is not None:  # start-up: data checks, model, restoring a backup
        result["seconds_to_first_step"] = round(seconds["to_first_step"], 2)
    result["validation_seconds"] = round(seconds["validation"], 1)
    result["backup_seconds"] = round(seconds["backup"], 1)
    result["seconds"] = round(time.perf_counter() - seconds["started"], 1)
    write_json(os.path.join(out_dir, "result.json"), result)
    trainer.join_processes()
    return result
