import json
import os
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

from pipelines.commands.train import main
from pipelines.data import shards
from pipelines.data.default_corpus import default_corpus
from pipelines.errors import DataError
from tests.pipelines.training.shared import TINY
from tests.test_case import killed_and_resumed, run_together

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def run_main(capsys, *argv):
    try:
        status = main(list(argv))
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err
    return err


def write(path, data):
    path.write_bytes(data)
    return str(path)


def test_bad_inputs_give_one_clear_error(tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run")]
    three, two = write(tmp_path / "a.en", b"a\nb\nc\n"), write(tmp_path / "a.de", b"x\ny\n")
    err = run_main(capsys, "--corpus", "files", "--train-files", three, two, *out)
    assert three in err and two in err and "3 lines" in err and "2 lines" in err
    bad = write(tmp_path / "bad.de", b"x\n\xc3\x28\nz\n")
    err = run_main(capsys, "--corpus", "files", "--train-files", three, bad, *out)
    assert "bad.de, line 2: not valid UTF-8" in err
    empty = write(tmp_path / "empty.en", b"\n \n")
    assert "empty" in run_main(capsys, "--corpus", "files", "--train-files", empty, empty, *out)
    missing = str(tmp_path / "missing.en")
    err = run_main(capsys, "--corpus", "files", "--train-files", missing, two, *out)
    assert f"train_files: file not found: {missing}" in err
    err = run_main(capsys, "--corpus", "tfds", "--tfds-name", "no_such_dataset/en-de", *out)
    assert "Unknown TFDS dataset 'no_such_dataset/en-de'" in err
    assert "Multi30k folder not found" in run_main(
        capsys, "--recipe", "multi30k", "--multi30k-dir", missing, *out
    )
    err = run_main(capsys, "--set", "output.heldout_split=dev", *out)
    assert "heldout_split must be one of ['test', 'validation', 'none']" in err
    # No bad input leaves a file behind (the folder itself is made to check it can be written).
    assert list((tmp_path / "run").iterdir()) == []


def test_bad_input_in_a_fresh_process_has_no_traceback(tmp_path):
    process = subprocess.run(
        [sys.executable, "-m", "pipelines", "train", "--corpus", "files", "--train-files",
         str(tmp_path / "nope.en"), str(tmp_path / "nope.de"), "--output-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert process.returncode == 2
    assert "Traceback" not in process.stderr
    assert process.stderr.strip().splitlines() == [
        f"error: train_files: file not found: {tmp_path}/nope.en"
    ]


def test_short_run_writes_every_output(tmp_path, capsys):
    out = str(tmp_path / "run")
    args = ["--output-dir", out, "--steps", "4", "--steps-per-epoch", "2", "--average-last", "2"]
    sampling = ["--subword-sampling", "0.2", "--set", "subword_copies=2"]
    assert main(args + sampling + TINY + ["--input-streams", "2"]) == 0
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["steps"] == 4 and result["resumed_at_step"] == 0
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == [
        "best.json",
        "best.keras",
        "epoch-001.keras",
        "epoch-002.keras",
    ]
    assert len(result["history"]["loss"]) == 2 and "val_loss" in result["history"]
    best = json.loads((tmp_path / "run" / "checkpoints" / "best.json").read_text())
    losses = result["history"]["val_loss"]
    assert best["val_loss"] == pytest.approx(min(losses), abs=1e-5)
    assert best["step"] == 2 * (1 + losses.index(min(losses)))
    # The run's last backup stays, so a rerun with more steps goes on from step 4.
    assert os.listdir(os.path.join(out, "backup")) == ["step-000000004"]
    assert "greedy_bleu" in result and len(result["examples"]) == 5
    assert result["heldout_split"] == "test"
    test_sources = [s for s, _ in default_corpus([1500, 40, 40])["test"]]
    assert (tmp_path / "run" / "heldout.source").read_text().splitlines() == test_sources
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["optimization"]["steps"] == 4 and config["model"]["hidden_dim"] == 32
    assert config["batching"]["input_streams"] == 2
    # Stdout is not a terminal here: one plain line an epoch, no bar.
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("epoch ")]
    assert [line.split(",")[0] for line in lines] == ["epoch 1: step 2/4", "epoch 2: step 4/4"]
    assert "steps/s" in lines[0] and "left" in lines[0] and "val_loss" in lines[0]
    assert "\r" not in printed and "\x1b" not in printed
    # Trained on two BPE-dropout copies of the 1,500 pairs, prepared in complete shards,
    # one for each of the two input streams.
    manifest = shards.read_manifest(os.path.join(out, "data", "train"))
    assert manifest["corpora"][0]["examples"] == 2 * 1500
    assert len(manifest["corpora"][0]["shards"]) == 2
    model = keras.saving.load_model(os.path.join(out, "model.keras"))
    assert model.hidden_dim == 32 and model.vocabulary_size == 200
    events = os.listdir(os.path.join(out, "logs", "train"))
    assert any(name.startswith("events.out.tfevents") for name in events)


@pytest.mark.parametrize("split", ["validation", "none"])
def test_heldout_split_chooses_what_the_run_decodes_at_its_end(tmp_path, split):
    out = tmp_path / "run"
    args = ["--output-dir", str(out), "--steps", "2", "--set", f"output.heldout_split={split}"]
    assert main(args + TINY) == 0
    result = json.loads((out / "result.json").read_text())
    if split == "none":  # a study that scores its own way touches no held-out split
        assert "greedy_bleu" not in result and "heldout_split" not in result
        assert not (out / "heldout.source").exists()
        return
    assert result["heldout_split"] == "validation" and "greedy_bleu" in result
    validation = default_corpus([1500, 40, 40])["validation"]
    assert (out / "heldout.source").read_text().splitlines() == [s for s, _ in validation]
    assert (out / "heldout.target").read_text().splitlines() == [t for _, t in validation]


@pytest.mark.slow
def test_a_run_killed_late_resumes_on_the_batches_it_would_have_read(tmp_path):
    # About 60 batches a pass: the kill comes after step 200, in the fourth pass.
    steps = ["--steps", "300", "--steps-per-epoch", "300", "--backup-every", "5"]
    flags = [*steps, *TINY, "--set", "heldout_split=none"]
    out = tmp_path / "run"
    command = [sys.executable, "-m", "pipelines", "train", "--output-dir", str(out), *flags]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # In a process of its own too: this one has two logical CPUs (two replicas).
    whole = [*command[:5], str(tmp_path / "whole"), *flags]
    assert subprocess.run(whole, cwd=ROOT, env=env, capture_output=True).returncode == 0
    second = killed_and_resumed(
        command, ROOT, env, out / "backup", out / "result.json", after_step=200
    )
    assert second.returncode == 0, second.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert 200 <= result["resumed_at_step"] < 300 and result["steps"] == 300
    assert f"Resuming at step {result['resumed_at_step']} of 300" in second.stderr
    assert "Skipping" not in second.stderr  # the stream's position was restored, not re-read
    whole, resumed = (keras.saving.load_model(d / "model.keras") for d in (tmp_path / "whole", out))
    for expected, actual in zip(whole.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_worker_environments():
    """The environments of two local MultiWorkerMirroredStrategy workers, on free ports."""
    workers = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    return [
        {
            **os.environ,
            "TF_CONFIG": json.dumps(
                {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
            ),
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        for index in range(2)
    ]


def train_on_two_workers(out, *flags, timeout=600):
    """Runs the train command as two local workers; returns their two logs."""
    environments = two_worker_environments()
    command = [sys.executable, "-m", "pipelines", "train", "--output-dir", str(out), *TINY, *flags]
    return run_together(command, ROOT, environments, timeout)


def worker_outputs(out):
    """The two workers' output folders: the chief's, then worker 1's."""
    return out, out / "workers" / "worker-1"


def assert_same_weights_and_steps(out):
    """Both workers' final models are identical; returns their result.json files."""
    chief, other = (keras.saving.load_model(d / "model.keras") for d in worker_outputs(out))
    for a, b in zip(chief.get_weights(), other.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    results = [json.loads((d / "result.json").read_text()) for d in worker_outputs(out)]
    assert results[0]["steps"] == results[1]["steps"]
    return results


@pytest.mark.slow
def test_two_workers_train_to_identical_weights(tmp_path):
    out = tmp_path / "run"
    steps = ["--steps", "6", "--steps-per-epoch", "3", "--accumulation-steps", "2"]
    # Compare the trained weights, not an average; each worker reads two input streams.
    logs = train_on_two_workers(out, *steps, "--average-last", "1", "--input-streams", "2")
    assert assert_same_weights_and_steps(out)[0]["steps"] == 6
    assert "MultiWorkerMirroredStrategy" in logs[0]


@pytest.mark.slow
def test_two_workers_with_a_time_budget_stop_at_the_same_step(tmp_path):
    # The workers start apart, and each times the budget from its own start:
    # their plans agree only if every worker reads the same clock.
    out = tmp_path / "run"
    # A minute of training, so a loaded machine (the suite's other worker) still leaves steps,
    # and 45 s kept for averaging and the held-out translation, which traces its search.
    budget = ["--max-minutes", "1.75", "--set", "reserve_minutes=0.75", "--cooldown", "0.3"]
    flags = ["--set", "steps=null", "--steps-per-epoch", "5", "--average-last", "1", *budget]
    train_on_two_workers(out, *flags, timeout=300)
    results = assert_same_weights_and_steps(out)
    plans = [
        json.loads((d / "budget.json").read_text())["total_steps"] for d in worker_outputs(out)
    ]
    assert plans == [results[0]["steps"]] * 2 and results[0]["steps"] >= 10
    assert results[0]["final_learning_rate"] == results[1]["final_learning_rate"] == 0.0


@pytest.mark.slow
def test_two_workers_killed_late_resume_on_the_batches_they_would_have_read(tmp_path):
    from pipelines.training.backup import backup_folders

    # About 60 batches a pass over two workers: the kill comes after step 80, in the second.
    flags = ["--steps", "160", "--steps-per-epoch", "160", "--backup-every", "5",
             "--average-last", "1", "--set", "heldout_split=none"]  # fmt: skip
    train_on_two_workers(tmp_path / "whole", *flags)
    out = tmp_path / "run"
    environments = two_worker_environments()
    command = [sys.executable, "-m", "pipelines", "train", "--output-dir", str(out), *TINY, *flags]
    processes = [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        for env in environments
    ]
    backups = [d / "backup" for d in worker_outputs(out)]
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline and any(p.poll() is None for p in processes):
        steps = [backup_folders(str(d))[-1][0] if d.exists() and backup_folders(str(d)) else 0
                 for d in backups]  # fmt: skip
        if min(steps) >= 80:
            break
        time.sleep(0.2)
    for process in processes:  # both at once, the way a lost job ends
        process.kill()
        process.wait()
    assert min(steps) >= 80 and not (out / "result.json").exists(), steps
    logs = train_on_two_workers(out, *flags)
    results = assert_same_weights_and_steps(out)
    resumed_at = {r["resumed_at_step"] for r in results}  # the newest step both hold
    assert len(resumed_at) == 1 and min(steps) <= resumed_at.pop() < 160
    assert all("Skipping" not in log for log in logs)  # positions restored, nothing re-read
    whole = keras.saving.load_model(tmp_path / "whole" / "model.keras")
    resumed = keras.saving.load_model(out / "model.keras")
    for expected, actual in zip(whole.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)


def test_a_run_with_a_budget_trains_inside_it_to_the_end_of_its_schedule(tmp_path, capsys):
    out = tmp_path / "run"
    # A minute of training, so a loaded machine (the suite's other worker) still leaves steps;
    # 45 s kept for averaging and the held-out translation, which traces its search.
    budget = ["--max-minutes", "1.75", "--set", "reserve_minutes=0.75", "--cooldown", "0.3"]
    args = ["--output-dir", str(out), "--set", "steps=null", "--steps-per-epoch", "5", *budget]
    assert main(args + TINY) == 0
    result = json.loads((out / "result.json").read_text())
    plan = json.loads((out / "budget.json").read_text())
    # The last epoch ends inside the budget by its own clock (its plan aims at the budget less
    # the reserve, 60 s; under a loaded CI a run has ended 31 s past that). The process's
    # `training_seconds` also holds the callbacks' work after the last epoch until `fit`
    # returns, which a loaded machine has stretched by 90 s, and what follows training
    # (averaging, translating) is the reserve's estimate, so neither is held to the budget.
    assert plan["trained_seconds"] <= 105
    assert plan["trained_seconds"] <= result["training_seconds"] <= result["seconds"]
    assert result["steps"] == plan["total_steps"]
    assert result["steps"] >= 10  # the budget was spent, not only met
    assert result["final_learning_rate"] == 0.0
    rates = result["history"]["learning_rate"]
    assert rates[-1] == 0.0 and max(rates) > 0.0


def test_a_run_folder_prepared_from_other_data_is_refused(tmp_path, capsys):
    out = ["--output-dir", str(tmp_path / "run"), "--steps", "2"]
    assert main(out + TINY) == 0
    plan = (tmp_path / "run" / "data" / "train" / "plan.json").read_bytes()
    other = ["--set", "vocabulary_sample=100", "--shard-size", "9"]
    err = run_main(capsys, *out, *TINY, *other)
    assert "data.shard_size 200000 -> 9, batching.vocabulary_sample 500000 -> 100" in err
    # The prepared data is checked too, where the run's settings are not recorded.
    (tmp_path / "run" / "config.json").unlink()
    err = run_main(capsys, *out, *TINY, *other)
    data = tmp_path / "run" / "data"
    assert (
        f"{data} holds data prepared from other data or settings (vocabulary_sample, shard_size)"
        in err
    )
    assert "train into a new output_dir" in err
    assert (tmp_path / "run" / "data" / "train" / "plan.json").read_bytes() == plan


def test_a_run_prepared_for_fewer_workers_is_refused_and_a_new_vocabulary_prepares_anew(tmp_path):
    from pipelines.training.data import prepare_data
    from pipelines.training.loading import load_config

    out = tmp_path / "run"
    config = load_config(settings={"output_dir": str(out), "default_corpus_sizes": [300, 20, 20],
                                   "vocabulary_size": 200})  # fmt: skip
    train, _, _ = prepare_data(config, str(out))
    assert len(train["corpora"][0]["shards"]) == 1
    with pytest.raises(DataError, match="prepared for 1 workers, and this run has 2"):
        prepare_data(config, str(out), workers=2)
    assert json.loads((out / "data" / "failed.json").read_text())["error"].startswith(str(out))
    # A vocabulary trained again (another size) since: the shards are made again, not refused.
    (out / "sentencepiece.model").unlink()
    config.batching.vocabulary_size = 150
    again, _, _ = prepare_data(config, str(out))
    assert again["identity"]["vocabulary"] != train["identity"]["vocabulary"]
    assert again["corpora"][0]["examples"] == train["corpora"][0]["examples"] == 300
    assert not (out / "data" / "failed.json").exists() and (out / "data" / "ready.json").exists()


@pytest.mark.slow
def test_two_trainings_on_one_folder_at_once_one_refused_the_other_whole(tmp_path, capsys):
    out = tmp_path / "run"
    flags = ["--output-dir", str(out), "--steps", "40", "--steps-per-epoch", "20", *TINY]
    command = [sys.executable, "-m", "pipelines", "train", *flags]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        # Written under the lock, once the data is prepared.
        while not (out / "config.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        assert main(flags) == 2  # this process, while the other trains
    finally:
        assert first.wait(timeout=600) == 0
    err = capsys.readouterr().err
    assert err.startswith("error: output_dir") and f"process {first.pid}" in err
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 40 and result["resumed_at_step"] == 0
    assert not (out / "run.lock").exists()
