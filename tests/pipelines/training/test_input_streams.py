"""Input streams: several a worker, shares even across workers, a tf.data service, identity."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from pipelines.commands import data_service
from pipelines.commands.data_service import start_server
from pipelines.data import corpus, preparation, shards
from pipelines.errors import ConfigError, DataError
from pipelines.training import data
from pipelines.training.backup import RunBackup
from pipelines.training.identity import stream_settings
from pipelines.training.loading import load_config
from pipelines.training.parallel import training_batches

SMALL = {"default_corpus_sizes": [600, 20, 20], "vocabulary_size": 200, "shard_size": 100}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A run folder prepared for 1 worker and 2 input streams (8 shards)."""
    out = tmp_path_factory.mktemp("streams") / "run"
    config = load_config(settings={"output_dir": str(out), "input_streams": 2, **SMALL})
    train, _, _ = data.prepare_data(config, str(out))
    return config, train, str(out / "data" / "train")


def batches(config, manifest, folder, count, streams, pipeline=0, pipelines=1, **changes):
    config.batching.input_streams = streams
    for name, value in changes.items():
        setattr(config.batching, name, value)
    dataset = training_batches(config, manifest, folder, pipeline, pipelines, 400, seed=3)
    return [
        tuple(np.asarray(t) for t in tf.nest.flatten(b))
        for b in dataset.take(count).as_numpy_iterator()
    ]


def rows(batch):
    """The batch's source rows without padding, as tuples."""
    return {tuple(int(i) for i in row if i) for row in batch[0]}


def test_two_streams_interleave_disjoint_shards_the_same_way_each_time(prepared):
    config, manifest, folder = prepared
    assert data.planned_streams(folder) == 2
    assert len(manifest["corpora"][0]["shards"]) % 2 == 0
    first, again = (batches(config, manifest, folder, 24, 2) for _ in range(2))
    assert all(
        all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
        for a, b in zip(first, again, strict=True)
    )
    for batch in first:  # every batch keeps its token budget, per side
        (source, target_input, _) = batch
        assert source.size <= 400 and target_input.size <= 400
    # Batches in turn from two streams over disjoint shards: odd and even ones never share a row.
    even = set().union(*(rows(b) for b in first[0::2]))
    odd = set().union(*(rows(b) for b in first[1::2]))
    assert even and odd and not even & odd
    one = batches(config, manifest, folder, 24, 1)
    assert any(
        a[0].shape != b[0].shape or (a[0] != b[0]).any() for a, b in zip(one, first, strict=True)
    )


def test_workers_and_streams_share_every_corpus_evenly_and_a_resume_keeps_them(tmp_path):
    assert preparation.plan_shards([500, 2_000, 50], 1, 200, 4) == [4, 12, 4]
    out = tmp_path / "run"
    config = load_config(settings={"output_dir": str(out), "input_streams": 3, **SMALL})
    train, _, _ = data.prepare_data(config, str(out), workers=2)
    assert len(train["corpora"][0]["shards"]) == 6  # 600 pairs of 100 a shard, for 2 x 3
    with pytest.raises(DataError, match="prepared for 2 workers, and this run has 1: resume"):
        data.prepare_data(config, str(out), workers=1)
    config.batching.input_streams = None  # unset: the plan's
    data.prepare_data(config, str(out), workers=2)
    assert data.planned_streams(str(out / "data" / "train")) == 3
    config.batching.input_streams = 1  # 6 shards for 2 x 1: taken, and recorded
    data.prepare_data(config, str(out), workers=2)
    assert data.planned_streams(str(out / "data" / "train")) == 1
    config.batching.input_streams = 2
    with pytest.raises(DataError, match=r"input_streams: .* 2 workers x 2 input_streams cannot"):
        data.prepare_data(config, str(out), workers=2)
    failed = json.loads((out / "data" / "failed.json").read_text())["error"]
    assert failed.startswith("input_streams:")


def test_a_data_service_on_loopback_gives_the_local_streams_batches(prepared, capsys):
    # The servers `kt data-service` starts: a dispatcher and two workers, in this process.
    dispatcher = start_server("dispatcher")
    workers = [  # noqa: F841  (kept alive while the job runs)
        start_server("worker", dispatcher=dispatcher.target, host="localhost") for _ in range(2)
    ]
    assert data_service.main(["worker", "--port", "0"]) == 2
    assert "a worker needs --dispatcher HOST:PORT" in capsys.readouterr().err
    config, manifest, folder = prepared
    local = batches(config, manifest, folder, 12, 2, data_service=None)
    served = batches(config, manifest, folder, 12, 2, data_service=dispatcher.target)
    config.batching.data_service = None
    assert len(served) == len(local) == 12
    for a, b in zip(local, served, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_run_on_a_data_service_saves_no_position_and_resumes_on_a_new_order(tmp_path):
    config = load_config(settings={"data_service": "grpc://localhost:5050"})
    settings = stream_settings(config)
    assert settings["data_service"] == "grpc://localhost:5050"
    backup = RunBackup(str(tmp_path / "backup"), 10, stream_settings=settings)
    (tmp_path / "backup" / "step-000000010").mkdir(parents=True)
    state = {"step": 10, "stream": False, "stream_settings": settings, "data_seed": 5}
    (tmp_path / "backup" / "step-000000010" / "state.json").write_text(json.dumps(state))
    assert backup.choose_data_seed(5) != 5  # drawn from the run's seed and the step
    with pytest.raises(ConfigError, match="data_service must be grpc://HOST:PORT"):
        load_config(settings={"data_service": "localhost"})


def test_a_corpus_file_edited_in_place_is_told_apart(tmp_path):
    source, target = tmp_path / "a.en", tmp_path / "a.de"
    source.write_text("".join(f"line {i:06d}\n" for i in range(200_000)))
    target.write_text("x\n" * 200_000)
    before = corpus.files_corpus(str(source), str(target)).identity
    text = source.read_text()
    middle = len(text) // 2
    stat = source.stat()
    source.write_text(text[:middle] + ("9" if text[middle] != "9" else "8") + text[middle + 1 :])
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # size and time kept
    after = corpus.files_corpus(str(source), str(target)).identity
    assert after["files"][0]["bytes"] == before["files"][0]["bytes"]
    assert after["files"][0]["modified_ns"] == before["files"][0]["modified_ns"]
    assert corpus.sampled_sha256(str(source), 64, 1 << 16) != before["files"][0]["sampled_sha256"]


def test_a_manifest_of_another_format_is_refused(prepared, tmp_path):
    _, manifest, _ = prepared
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "format": 0}))
    with pytest.raises(DataError, match="prepared in format 0, and this version reads format 1"):
        shards.read_manifest(str(tmp_path))


def test_a_target_vocabulary_is_the_configs_not_the_folders(tmp_path):
    out = tmp_path / "run"
    config = load_config(settings={"output_dir": str(out), "input_streams": 1, **SMALL})
    shared, _, _ = data.prepare_data(config, str(out))
    assert "target_vocabulary" not in shared["identity"]  # as a run of an earlier version
    # A target model appearing beside the run's vocabulary does not change its data silently.
    (out / "sentencepiece.target.model").write_bytes((out / "sentencepiece.model").read_bytes())
    with pytest.raises(DataError, match="holds sentencepiece.target.model, and the run's target"):
        data.prepare_data(config, str(out))
    config.batching.target_vocabulary = True  # as --init-from an imported model sets it
    separate, _, _ = data.prepare_data(config, str(out))
    assert separate["identity"]["target_vocabulary"] == separate["identity"]["vocabulary"]
    (out / "sentencepiece.target.model").unlink()
    with pytest.raises(DataError, match="lacks sentencepiece.target.model"):
        data.prepare_data(config, str(out))


def test_a_plan_of_an_earlier_version_resumes_and_a_changed_file_is_named(tmp_path):
    source, target = tmp_path / "a.en", tmp_path / "a.de"
    source.write_text("".join(f"w{i} x{i % 97} y{i % 31}\n" for i in range(700)))
    target.write_text("".join(f"v{i} z{i % 89} q{i % 29}\n" for i in range(700)))

    def config(out):
        return load_config(settings={"output_dir": str(out), "input_streams": 1,
                                     "corpus": "files", "train_files": [str(source), str(target)],
                                     **SMALL, "vocabulary_size": 24})  # fmt: skip

    old, new = tmp_path / "old", tmp_path / "new"
    data.prepare_data(config(old), str(old))
    data.prepare_data(config(new), str(new))
    plan_path = old / "data" / "train" / "plan.json"
    plan = json.loads(plan_path.read_text())
    for entry in plan["identity"]["corpora"][0]["files"]:  # as an earlier version wrote it
        del entry["modified_ns"], entry["sampled_sha256"]
    plan_path.write_text(json.dumps(plan))
    os.utime(source, ns=(0, source.stat().st_mtime_ns + 10**9))
    data.prepare_data(config(old), str(old))  # what it recorded (path, size) still holds
    with pytest.raises(DataError, match=f"{source}: modified_ns changed"):
        data.prepare_data(config(new), str(new))
