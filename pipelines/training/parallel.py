"""The backend half of a training run: the strategy, the input streams, the trainer.

`tensorflow_parallel` (tf.distribute) and `jax_parallel`
(`keras.distribution.DataParallel`) return the same namespace, so that
`run.run_training` is written once for both backends.
"""

import functools
import hashlib
import json
import os
import uuid
from types import SimpleNamespace

import tensorflow as tf

from pipelines.data import batching, shards
from pipelines.errors import ConfigError
from pipelines.training.budget import budget_clock
from pipelines.training.process_batches import ProcessBatches
from pipelines.training.streams import MappedStream, TensorStream, to_numpy
from pipelines.training.trainer import Trainer

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
    if _tf_workers() > 1:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        return strategy, strategy.cluster_resolver.task_id
    return tf.distribute.MirroredStrategy(), 0


def _tf_workers():
    """The workers `TF_CONFIG` lists (1 without it)."""
    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    return max(sum(len(tasks) for tasks in cluster.values()), 1)


def chief_by_environment():
    """Whether this process is the chief, as its environment says before the workers meet."""
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    return task.get("index", 0) == 0 and os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0") == "0"


def _train_dataset_fn(config, manifest, folder, seed):
    """A function for `strategy.distribute_datasets_from_function`.

    Each input pipeline (worker) reads its own shards of the prepared
    examples, and each replica's batches hold `batch_tokens / replicas`
    tokens, so a global batch holds about `batch_tokens`.
    """

    def dataset_fn(context):
        return training_batches(
            config,
            manifest,
            folder,
            context.input_pipeline_id,
            context.num_input_pipelines,
            config.batching.batch_tokens // context.num_replicas_in_sync,
            seed,
        )

    return dataset_fn


def training_batches(
    config, manifest, folder, pipeline, pipelines, batch_tokens, seed=None, **shapes
):
    """Input pipeline `pipeline`'s training batches: its shards, shuffled, repeated, bucketed.

    The pipeline runs `config.batching.input_streams` streams at once, each
    over its own shards with its own length buckets (`group_by_window` runs
    in one thread a stream), and takes their batches in turn, so the order
    is a function of the seed and every batch keeps its token budget. With
    `data_service` the streams run on that tf.data service's workers, which
    read the shards at the same paths.

    Args:
        config: the run's `TrainConfig` (seed, shuffle buffer, `max_length`,
            `input_streams`, `data_service`).
        manifest, folder: the prepared training data (`shards.read_manifest`).
        pipeline, pipelines: int, this input pipeline and their number
            (stream `s` of `S` reads every `pipelines * S`-th shard from
            `pipeline * S + s`, see `shards.read_examples`).
        batch_tokens: int, this pipeline's token budget (`max_length` at least).
        seed: int or None, the data order's seed (None: the run's; see
            `backup.data_order_seed`).
        **shapes: `fixed_shapes`, `row_multiple`, `ratio` for
            `batching.batch_examples` (JAX's one shape per bucket).

    Returns:
        `tf.data.Dataset` of `((source_ids, target_input_ids), target_output_ids)`.
    """
    seed = config.optimization.seed if seed is None else seed
    streams = config.batching.input_streams or 1
    parts = []
    for stream in range(streams):
        stream_seed = _stream_seed(seed, stream)
        examples = shards.read_examples(
            manifest, folder, True, stream_seed, pipeline * streams + stream, pipelines * streams
        )
        part = batching.batch_examples(
            examples,
            max(batch_tokens, config.batching.max_length),
            config.batching.max_length,
            shuffle=True,
            repeat=True,
            seed=stream_seed,
            shuffle_buffer=max(config.batching.shuffle_buffer // streams, 1),
            cache=False,
            pad_id=shards.special_ids(manifest)["pad_id"],
            **shapes,
        )
        if config.batching.data_service:
            part = _on_service(part, config, f"{seed}-{pipeline}-{stream}")
        parts.append(part)
    if streams == 1:
        return parts[0]
    return tf.data.Dataset.choose_from_datasets(parts, tf.data.Dataset.range(streams).repeat())


def _stream_seed(seed, stream):
    """Stream `stream`'s shuffling seed: the run's for the first, others derived from it."""
    return seed if stream == 0 else seed + 7919 * stream


def _on_service(part, config, name):
    """`part` produced by one worker of `config`'s tf.data service, in order.

    One split (the dataset of one element that the stream hangs from) goes
    to one service worker, which produces the whole stream; the job's name
    holds the run's folder, this attempt and the stream, so a run's
    consumers never share a job with another run's or an earlier attempt's.
    """
    service = tf.data.experimental.service
    address = config.batching.data_service
    if not address.startswith("grpc://"):
        address = f"grpc://{address}"
    run = hashlib.sha256(os.path.abspath(config.output.output_dir).encode()).hexdigest()[:12]
    # A job of its own each time the run starts: a name a killed attempt used would
    # join its job, mid-stream, while the dispatcher still holds it.
    attempt = uuid.uuid4().hex[:8]
    hanging = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).flat_map(lambda _: part)
    return hanging.apply(
        service.distribute(
            processing_mode=service.ShardingPolicy.DYNAMIC,
            service=address,
            job_name=f"kt-{run}-{attempt}-{name}",
        )
    )


def tensorflow_parallel(config):
    """The TensorFlow half of a run: tf.distribute strategy, per-replica batches, `Trainer`."""
    strategy, worker = make_strategy()
    options = config.optimization
    return SimpleNamespace(
        worker=worker,
        workers=_tf_workers(),
        scope=strategy.scope,
        train_data=_train_dataset_fn,
        validation_data=lambda manifest, folder: _validation_batches(config, manifest, folder),
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


def _validation_batches(config, manifest, folder, **shapes):
    """The prepared validation examples in batches of `batch_tokens`, in order, once.

    `shapes`: JAX's fixed-shape options, as `training_batches` takes them.
    """
    batching_config = config.batching
    return batching.batch_examples(
        shards.read_examples(manifest, folder),
        batching_config.batch_tokens,
        batching_config.max_length,
        shuffle=False,
        cache=False,
        pad_id=shards.special_ids(manifest)["pad_id"],
        **shapes,
    )


def process_batches(
    config, manifest, folder, pipelines, processes, row_multiple, gather=None, seed=None
):
    """The training batches of JAX processes that each read their own shards.

    Process `p` of `processes` batches the shards of input pipeline `p` into
    fixed-shape buckets of `batch_tokens / processes` tokens, and the
    processes agree on each step's bucket (`ProcessBatches`), so a global
    batch holds about `batch_tokens`.

    Args:
        config: the run's `TrainConfig`.
        manifest, folder: the prepared training data (`shards.read_manifest`).
        pipelines: list of int, the input pipelines this process runs: its
            own index, or all of them where one process stands for all.
        processes: int, the number of input pipelines (processes).
        row_multiple: int, each local batch's rows are a multiple of it
            (the process's devices).
        gather: callable, the processes' all-gather (see `ProcessBatches`);
            None where this process runs every pipeline.
        seed: int or None, the data order's seed (None: the run's).

    Returns:
        `ProcessBatches` over the local batches of `pipelines`.
    """
    shapes = {"fixed_shapes": True, "row_multiple": row_multiple, "ratio": JAX_BUCKET_RATIO}
    budget = config.batching.batch_tokens // processes

    def stream(pipeline):
        batches = training_batches(
            config, manifest, folder, pipeline, processes, budget, seed, **shapes
        )
        return MappedStream(TensorStream(batches), to_numpy)

    bounds = batching.bucket_bounds(config.batching.max_length, JAX_BUCKET_RATIO)
    return ProcessBatches(lambda: [stream(p) for p in pipelines], bounds, gather)


def jax_parallel(config):
    """The JAX half of a run: `DataParallel` over every device, fixed-shape batches, `JaxTrainer`.

    One process reads global batches of about `batch_tokens` tokens; several
    processes each read their own shards (`process_batches`). Batch sizes are
    multiples of the device count.
    """
    import jax

    from pipelines.training.jax_trainer import JaxTrainer, jax_budget_clock, make_distribution

    if config.optimization.mixed_precision == "mixed_float16":
        raise ConfigError(
            "optimization.mixed_precision: mixed_float16 needs loss scaling, which training "
            "on JAX does not do; use mixed_bfloat16"
        )
    distribution, worker = make_distribution()
    shapes = {
        "fixed_shapes": True,
        "row_multiple": distribution.device_mesh.devices.size,
        "ratio": JAX_BUCKET_RATIO,
    }
    options = config.optimization

    processes = jax.process_count()
    if processes > 1 and config.output.validation_sentences:
        raise ConfigError(
            "output.validation_sentences: a run of several JAX processes does not decode while "
            "it trains (its weights span the processes); score with metric loss"
        )

    def train_data(config, manifest, folder, seed):  # the run's config, its streams resolved
        if processes > 1:
            from jax.experimental import multihost_utils

            index = jax.process_index()
            return process_batches(
                config,
                manifest,
                folder,
                [index],
                processes,
                jax.local_device_count(),
                multihost_utils.process_allgather,
                seed,
            )
        return training_batches(
            config, manifest, folder, 0, 1, config.batching.batch_tokens, seed, **shapes
        )

    return SimpleNamespace(
        worker=worker,
        workers=processes,
        scope=distribution.scope,
        train_data=train_data,
        validation_data=lambda manifest, folder: _validation_batches(
            config, manifest, folder, **shapes
        ),
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
