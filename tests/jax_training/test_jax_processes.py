"""Two JAX processes, each reading its own shards, train as one process on the same batches."""

import json
import os
import socket
import sys

import keras
import numpy as np
import pytest

from pipelines.data import shards
from pipelines.training.loading import load_config
from pipelines.training.parallel import process_batches
from pipelines.training.process_batches import ProcessBatches
from tests.jax_training.shared import train_on_one_device
from tests.pipelines.training.shared import TINY
from tests.test_case import run_together

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch(bound, rows, tag):
    """A fixed-shape batch of `rows` rows whose source length is `bound`, its ids all `tag`."""
    source = np.full((rows, bound), tag, np.int32)
    target = np.full((rows, bound), tag, np.int32)
    return (source, target), target


def test_processes_agree_on_a_bucket_they_all_hold():
    bounds = [4, 8, 16]
    # Pipeline 0 reads lengths 4, 8, 8, 16; pipeline 1 reads 8, 16, 4, 4.
    streams = [
        [batch(4, 2, 1), batch(8, 1, 2), batch(8, 1, 3), batch(16, 1, 4)],
        [batch(8, 1, 5), batch(16, 1, 6), batch(4, 2, 7), batch(4, 2, 8)],
    ]
    steps = list(ProcessBatches(lambda: [iter(s) for s in streams], bounds))
    # After two reads both hold an 8, after four a 4, after six a 16; then pipeline 0 ends.
    shapes = [step[0][0].shape for step in steps]
    tags = [sorted(set(step[0][0][:, 0].tolist())) for step in steps]
    assert shapes == [(2, 8), (4, 4), (2, 16)], shapes
    assert tags == [[2, 5], [1, 7], [4, 6]], tags

    # A process that runs one pipeline gets its own rows, chosen on every pipeline's counts.
    def gather(rows):  # the other process holds one batch of length 8, its stream going on
        return np.concatenate([rows, [[0, 1, 0, 0]]])

    mine = ProcessBatches(lambda: [iter(streams[0])], bounds, gather)
    (source, _), _ = next(iter(mine))
    assert source.shape == (1, 8) and source[0, 0] == 2  # its 8, as pipeline 1 holds one too


def test_pending_batches_are_bounded(caplog):
    bounds = [4, 8]
    # Pipeline 0 reads ten 8s before its first 4; pipeline 1 reads only 4s.
    lonely = [batch(8, 1, 9)] * 10 + [batch(4, 1, 1)]
    steps = ProcessBatches(
        lambda: [iter(lonely), iter([batch(4, 1, 2)] * 11)], bounds, max_pending=3
    )
    (source, _), _ = next(iter(steps))
    assert source.shape == (2, 4) and source[:, 0].tolist() == [1, 2]
    assert "16 local batches dropped" in caplog.text  # 8 of each pipeline, 3 kept and one read


def test_a_restored_stream_goes_on_with_the_batches_it_held(tmp_path):
    import tensorflow as tf

    from pipelines.training.streams import MappedStream, TensorStream, to_numpy

    bounds = [4, 8, 16]
    lengths = [[4, 8, 8, 16, 4, 16, 8, 4] * 3, [8, 16, 4, 4, 16, 8, 8, 4] * 3]

    def make_streams():  # saveable tf.data streams, as the run's pipelines are
        def dataset(pipeline):
            rows = [batch(n, 1, 100 * pipeline + t) for t, n in enumerate(lengths[pipeline])]
            data = tf.data.Dataset.from_tensors(rows[0])
            for row in rows[1:]:
                data = data.concatenate(tf.data.Dataset.from_tensors(row))
            return data

        return [MappedStream(TensorStream(dataset(p)), to_numpy) for p in (0, 1)]

    def tags(step):
        return step[0][0][:, 0].tolist()

    whole = [tags(step) for step in ProcessBatches(make_streams, bounds)]
    stream = iter(ProcessBatches(make_streams, bounds))
    first = [tags(next(stream)) for _ in range(5)]
    assert any(len(queue) for queues in stream.pending for queue in queues.values())
    stream.save(str(tmp_path / "stream"))
    restored = iter(ProcessBatches(make_streams, bounds))
    restored.restore(str(tmp_path / "stream"))
    assert first + [tags(step) for step in restored] == whole


def run_processes(out, flags, timeout=600):
    """`kt train` as two JAX processes of one CPU device each, on a loopback coordinator."""
    coordinator = f"127.0.0.1:{free_port()}"
    environments = [
        {
            **os.environ,
            "KERAS_BACKEND": "jax",
            "XLA_FLAGS": "--xla_force_host_platform_device_count=1",
            "KERAS_DISTRIBUTION_JOB_ADDRESSES": coordinator,
            "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
            "KERAS_DISTRIBUTION_PROCESS_ID": str(index),
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        for index in range(2)
    ]
    command = [sys.executable, "-m", "pipelines", "train", "--output-dir", str(out), *flags]
    return run_together(command, ROOT, environments, timeout)


@pytest.mark.slow
def test_two_processes_train_as_one_process_on_the_same_global_batches(tmp_path):
    out = tmp_path / "run"
    streams = ["--input-streams", "2"]  # each process reads two streams (after TINY's 1)
    flags = ["--steps", "6", "--steps-per-epoch", "3", "--average-last", "1", *TINY, *streams]
    run_processes(out, flags)
    result = json.loads((out / "result.json").read_text())
    # Process 0 decoded the held-out split alone, from a copy of the weights of its own.
    assert result["steps"] == 6 and "greedy_bleu" in result
    train_dir = str(out / "data" / "train")
    manifest = shards.read_manifest(train_dir)
    assert len(manifest["corpora"][0]["shards"]) == 4  # one a stream of each process
    # Process 1 prepared nothing: it waited for the chief's data.
    assert not (out / "workers" / "worker-1" / "data").exists()
    # One process, one device, the two pipelines' rows side by side: the same steps.
    config = load_config(config_file=str(out / "config.json"))
    batches = process_batches(config, manifest, train_dir, [0, 1], 2, row_multiple=1)
    history, model, _ = train_on_one_device(config, out, batches, steps=9, steps_per_epoch=3)
    assert history.history["loss"][:2] == pytest.approx(result["history"]["loss"], abs=2e-5)
    trained = keras.saving.load_model(str(out / "checkpoints" / "epoch-002.keras"))
    # Given 3 more steps, both processes go on from their backups: each restores its
    # pipeline's position and the batches it held, and they take the steps one process takes.
    run_processes(out, ["--steps", "9", *flags[2:]])
    extended = json.loads((out / "result.json").read_text())
    assert extended["resumed_at_step"] == 6 and extended["steps"] == 9
    assert extended["history"]["loss"] == pytest.approx(history.history["loss"][2:], abs=2e-5)
    trained = keras.saving.load_model(str(out / "checkpoints" / "epoch-003.keras"))
    for expected, actual in zip(trained.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(actual, expected, atol=1e-4)
