"""One training run from a `TrainConfig`: data, vocabulary, model, fit, save."""

import functools
import json
import logging
import os
import sys
import time
from types import SimpleNamespace

import keras
import tensorflow as tf

import keras_transformer as kt
from pipelines.data import batching, corpus, default_corpus, tokenizer
from pipelines.errors import ConfigError, DataError
from pipelines.files import atomic_output, atomic_text, write_json
from pipelines.parsing import trees
from pipelines.parsing.corpus import (
    tags_path,
    target_tokens,
    treebank_pairs,
)
from pipelines.training.checkpoints import (
    average_checkpoints,
    checkpoints_to_average,
    epoch_checkpoints,
    repair_backup,
)
from pipelines.training.heldout import heldout_pairs, heldout_scores, is_parser, tree_words
from pipelines.training.loop import optimizer_steps
from pipelines.training.progress import ProgressLines
from pipelines.training.trainer import TimeBudget, Trainer, budget_clock

logger = logging.getLogger(__name__)

# The step limit of a run that only a time budget ends.
UNLIMITED_STEPS = 10**9

# Length buckets spaced this far apart under JAX, where each bucket is one
# batch shape and each shape one XLA compilation of the step (seconds each
# on a CPU): half the shapes of TensorFlow's 1.1 for a little more padding.
JAX_BUCKET_RATIO = 1.25


@functools.cache
def make_strategy():
    """MultiWorkerMirroredStrategy when TF_CONFIG lists several workers, else Mirrored.

    One strategy serves the whole process (the result is cached): two
    strategies in one process hand out the same collective instance keys and
    their all-reduces collide.

    Returns:
        `(strategy, worker_index)`; worker 0 is the chief that writes outputs.
    """
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    if sum(len(tasks) for tasks in cluster.values()) > 1:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        return strategy, strategy.cluster_resolver.task_id
    return tf.distribute.MirroredStrategy(), 0


def load_pairs(config):
    """Train and validation data for the configured corpus.

    Returns:
        `(train, validation, test)`: lists of str pairs or tf.data datasets;
        `test` is None where the corpus has no test split.
    """
    if config.data.corpus == "default":
        splits = default_corpus.default_corpus(
            config.data.default_corpus_sizes, config.data.target_locale, config.optimization.seed
        )
        return splits["train"], splits["validation"], splits["test"]
    if config.data.corpus == "multi30k":
        load = lambda split: corpus.load_multi30k(  # noqa: E731
            config.data.multi30k_dir,
            split,
            config.data.source_language,
            config.data.target_language,
        )
        return load("train"), load("validation"), load("test")
    if config.data.corpus == "ptb":
        load = lambda split: treebank_pairs(  # noqa: E731
            config.data.treebank_dir,
            split,
            config.data.treebank_pos_tags,
            config.data.treebank_words,
        )[0]
        train, validation, test = load("train"), load("dev"), load("test")
        if not train:
            raise DataError(
                f"treebank_dir {config.data.treebank_dir}: no wsj_NNNN.mrg files of the "
                "train split (wsj_0001-0141)"
            )
        return train, validation or None, test or None  # test files are often kept aside
    if config.data.corpus == "files":
        validation = config.data.validation_files
        return (
            corpus.read_parallel_files(*config.data.train_files),
            corpus.read_parallel_files(*validation) if validation else None,
            None,
        )
    load = lambda split: corpus.load_tfds(config.data.tfds_name, split, config.data.tfds_data_dir)  # noqa: E731
    return load(config.data.tfds_train_split), load(config.data.tfds_validation_split), None


def _sentences(pairs, limit=1_000_000):
    if isinstance(pairs, tf.data.Dataset):
        pairs = ((s.decode(), t.decode()) for s, t in pairs.take(limit).as_numpy_iterator())
    for source, target in pairs:
        yield source
        yield target


def _train_vocabulary(config, pairs, spm_path):
    """Trains the run's SentencePiece vocabulary on `pairs`, writing `spm_path`.

    It keeps whole each distinct target token (`whole_target_tokens`) and the
    `whole_source_words` most frequent source words. A parser's vocabulary
    that keeps source words whole lists its tags beside it (`tags_path`),
    written first: the vocabulary's file marks the step done for a resumed
    run.

    Raises:
        DataError: the tokens kept whole would fill the vocabulary.
    """
    batching = config.batching
    sample = pairs
    if isinstance(pairs, tf.data.Dataset):
        sample = list(_sentences(pairs, limit=100_000))
        sample = list(zip(sample[::2], sample[1::2], strict=True))
    tokens = []
    if batching.whole_target_tokens or (batching.whole_source_words and is_parser(config)):
        tokens = target_tokens(sample, tree_words(config))
    if batching.whole_target_tokens and len(tokens) >= batching.vocabulary_size // 2:
        raise DataError(
            f"whole_target_tokens: the targets have {len(tokens)} distinct tokens, too many for "
            f"vocabulary_size {batching.vocabulary_size} (at most half of it); "
            "it is meant for closed target vocabularies such as linearised trees"
        )
    words = tokenizer.frequent_words((s for s, _ in sample), batching.whole_source_words)
    whole = sorted(set(tokens if batching.whole_target_tokens else []).union(words))
    if len(whole) > batching.vocabulary_size * 3 // 4:
        raise DataError(
            f"whole_source_words: {len(whole)} tokens kept whole, too many for vocabulary_size "
            f"{batching.vocabulary_size} (at most three quarters of it, so that other words "
            f"still have pieces). Received: whole_source_words={batching.whole_source_words}"
        )
    listed = tags_path(spm_path)
    if words and is_parser(config):  # the tags are told apart from the source words kept whole
        with atomic_text(listed) as handle:
            handle.writelines(f"{tag}\n" for tag in sorted(trees.word_tags(tokens)))
    elif os.path.exists(listed):  # left by an earlier attempt with other settings
        os.remove(listed)
    logger.info("Training a %d-piece SentencePiece vocabulary", batching.vocabulary_size)
    tokenizer.train_sentencepiece(
        _sentences(pairs),
        spm_path,
        batching.vocabulary_size,
        seed=config.optimization.seed,
        whole_tokens=whole,
    )


def _callbacks(config, out_dir, is_chief, clock, schedule):
    backup_dir = os.path.join(out_dir, "backup")
    if os.path.isdir(backup_dir):
        repair_backup(backup_dir)
    callbacks = [
        keras.callbacks.BackupAndRestore(
            backup_dir, save_freq=config.output.backup_every, double_checkpoint=True
        ),
        keras.callbacks.TerminateOnNaN(),
    ]
    if is_chief:
        callbacks += [
            keras.callbacks.ModelCheckpoint(
                os.path.join(out_dir, "checkpoints", "epoch-{epoch:03d}.keras")
            ),
            keras.callbacks.TensorBoard(os.path.join(out_dir, "logs"), update_freq=50),
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
    if config.output.early_stopping_patience:
        callbacks.append(
            keras.callbacks.EarlyStopping(
                "val_loss",
                patience=config.output.early_stopping_patience,
                restore_best_weights=True,
            )
        )
    return callbacks


def _terminal():
    """Whether stdout is a terminal: the progress bar there, plain lines in a file."""
    return sys.stdout.isatty()


def _tokenized(config, pairs, tok, path, sampling_model=None):
    """Pairs tokenized once and saved under `path` (read back on resume).

    Training and validation read these ids back with `tf.data.Dataset.load`:
    a tensorflow-text tokenizer's resource is not visible to the per-device
    iterators of a distribution strategy, so no tokenizer runs inside them.
    Given `sampling_model` (a SentencePiece file) and `subword_sampling`, the
    saved examples are `subword_copies` BPE-dropout segmentations instead.
    """
    if not os.path.exists(os.path.join(path, "dataset_spec.pb")):
        if sampling_model and config.batching.subword_sampling:
            examples = batching.sampled_examples(
                pairs,
                sampling_model,
                config.batching.max_length,
                config.batching.subword_sampling,
                config.batching.subword_copies,
                config.optimization.seed,
            )
        else:
            examples = batching.tokenize_examples(pairs, tok, config.batching.max_length)
        examples.save(path)
    return tf.data.Dataset.load(path)


def _train_dataset_fn(config, examples):
    """A function for `strategy.distribute_datasets_from_function`.

    Each input pipeline reads its own shard of the tokenized examples, and each
    replica's batches hold `batch_tokens / replicas` tokens, so a global batch
    holds about `batch_tokens`.
    """

    def dataset_fn(context):
        shard = examples.shard(context.num_input_pipelines, context.input_pipeline_id)
        budget = max(
            config.batching.batch_tokens // context.num_replicas_in_sync, config.batching.max_length
        )
        return batching.batch_examples(
            shard,
            budget,
            config.batching.max_length,
            shuffle=True,
            repeat=True,
            seed=config.optimization.seed,
        )

    return dataset_fn


def _tensorflow_parallel(config):
    """The TensorFlow half of a run: tf.distribute strategy, per-replica batches, `Trainer`."""
    strategy, worker = make_strategy()
    options = config.optimization
    return SimpleNamespace(
        worker=worker,
        scope=strategy.scope,
        train_data=lambda examples: _train_dataset_fn(config, examples),
        validation_data=lambda examples: batching.batch_examples(
            examples, config.batching.batch_tokens, config.batching.max_length, shuffle=False
        ),
        trainer=lambda model, optimizer, schedule: Trainer(
            model,
            optimizer,
            strategy,
            label_smoothing=options.label_smoothing,
            accumulation_steps=options.accumulation_steps,
            jit_compile=options.xla,
        ),
        clock=lambda started: budget_clock(strategy, started),
    )


def _jax_parallel(config):
    """The JAX half of a run: `DataParallel` over every device, fixed-shape batches, `JaxTrainer`.

    Every process reads the same global batches of about `batch_tokens`
    tokens (see `JaxTrainer`); batch sizes are multiples of the device count.
    """
    from pipelines.training.jax_trainer import JaxTrainer, jax_budget_clock, make_distribution

    if config.optimization.mixed_precision == "mixed_float16":
        raise ConfigError(
            "optimization.mixed_precision: mixed_float16 needs loss scaling, which training "
            "on JAX does not do; use mixed_bfloat16"
        )
    distribution, worker = make_distribution()
    batch = functools.partial(
        batching.batch_examples,
        batch_tokens=config.batching.batch_tokens,
        max_length=config.batching.max_length,
        fixed_shapes=True,
        row_multiple=distribution.device_mesh.devices.size,
        ratio=JAX_BUCKET_RATIO,
    )
    options = config.optimization
    return SimpleNamespace(
        worker=worker,
        scope=distribution.scope,
        train_data=lambda examples: batch(examples, shuffle=True, repeat=True, seed=options.seed),
        validation_data=lambda examples: batch(examples, shuffle=False),
        trainer=lambda model, optimizer, schedule: JaxTrainer(
            model,
            optimizer,
            distribution,
            label_smoothing=options.label_smoothing,
            accumulation_steps=options.accumulation_steps,
            schedule=schedule,
        ),
        clock=jax_budget_clock,
    )


def build_model(config, spm_path):
    """The run's `Transformer`, learning-rate schedule and optimizer, as `config` sets them.

    Call it under the run's strategy or distribution scope, after
    `keras.utils.set_random_seed(config.optimization.seed)`: the same seed
    gives the same initial weights.

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
    model = kt.Transformer(**arguments)
    model.build(((None, None), (None, None)))
    # With a time budget the run's length is known only once steps are
    # timed: `TimeBudget` sets the schedule's total then.
    schedule = kt.TransformerSchedule(
        model.hidden_dim,
        config.optimization.warmup_steps,
        config.optimization.learning_rate_scale,
        total_steps=None if config.budget.max_minutes else config.optimization.steps,
        cooldown=config.optimization.cooldown,
    )
    optimizer = kt.transformer_optimizer(model.hidden_dim, schedule=schedule)
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
    started = time.perf_counter()
    backend = keras.backend.backend()
    if backend not in ("tensorflow", "jax"):
        raise ConfigError(f"kt train needs KERAS_BACKEND=tensorflow or jax, not {backend}")
    parallel = _jax_parallel(config) if backend == "jax" else _tensorflow_parallel(config)
    worker = parallel.worker
    out_dir = (
        config.output.output_dir
        if worker == 0
        else os.path.join(config.output.output_dir, "workers", f"worker-{worker}")
    )
    # The data is checked before anything is written in the output folder: a
    # corpus that fails to load (an unknown TFDS name) leaves no file behind.
    train_pairs, validation_pairs, test_pairs = load_pairs(config)
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "config.json"), config.to_dict())
    spm_path = os.path.join(out_dir, "sentencepiece.model")
    if not os.path.exists(spm_path):  # a resumed run keeps its vocabulary
        _train_vocabulary(config, train_pairs, spm_path)
    tok = tokenizer.load_tokenizer(spm_path)
    data_dir = os.path.join(out_dir, "data")
    train = _tokenized(config, train_pairs, tok, os.path.join(data_dir, "train"), spm_path)
    validation_data = None
    if validation_pairs is not None:
        validation = _tokenized(config, validation_pairs, tok, os.path.join(data_dir, "validation"))
        validation_data = parallel.validation_data(validation)

    if config.optimization.mixed_precision:
        keras.mixed_precision.set_dtype_policy(config.optimization.mixed_precision)
    keras.utils.set_random_seed(config.optimization.seed)
    with parallel.scope():
        model, schedule, optimizer = build_model(config, spm_path)
    logger.info("Model: %s parameters", f"{model.count_params():,}")
    trainer = parallel.trainer(model, optimizer, schedule)
    history = trainer.fit(
        parallel.train_data(train),
        steps=config.optimization.steps or UNLIMITED_STEPS,
        steps_per_epoch=config.optimization.steps_per_epoch,
        callbacks=_callbacks(config, out_dir, worker == 0, parallel.clock(started), schedule),
        validation_data=validation_data,
        verbose=1 if worker == 0 and _terminal() else 0,
    )
    seconds = {"started": started, "trained": time.perf_counter() - started}
    return _finish(config, out_dir, trainer, history, validation_pairs, test_pairs, seconds)


def _finish(config, out_dir, trainer, history, validation_pairs, test_pairs, seconds):
    model = trainer.model
    spm_path = os.path.join(out_dir, "sentencepiece.model")
    checkpoints = epoch_checkpoints(os.path.join(out_dir, "checkpoints"))
    model_path = os.path.join(out_dir, "model.keras")
    chosen = checkpoints_to_average(checkpoints, config.output)
    if len(chosen) > 1:
        logger.info("Averaging %d checkpoints", len(chosen))
        model = average_checkpoints(chosen, model_path)
    else:
        with atomic_output(model_path, suffix=".keras") as staging:
            model.save(staging)
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
        result.update(heldout_scores(config, out_dir, model, evaluation, split))
    # This process's wall-clock time to the end of training, and with evaluation included
    # (not earlier runs resumed from).
    result["training_seconds"] = round(seconds["trained"], 1)
    result["seconds"] = round(time.perf_counter() - seconds["started"], 1)
    write_json(os.path.join(out_dir, "result.json"), result)
    return result
