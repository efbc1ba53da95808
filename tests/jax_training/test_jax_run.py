import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from pipelines.commands.train import main
from pipelines.data import batching, shards
from pipelines.data.tokenizer import load_tokenizer, train_sentencepiece
from pipelines.evaluation import translate
from pipelines.training.loading import load_config
from pipelines.training.parallel import JAX_BUCKET_RATIO
from tests.jax_training.shared import train_on_one_device
from tests.pipelines.training.shared import TINY
from tests.test_case import killed_and_resumed, random_transformer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_the_tiny_recipe_trains_on_two_devices_as_on_one(tmp_path):
    out = tmp_path / "run"
    args = ["--output-dir", str(out), "--steps", "6", "--steps-per-epoch", "3", *TINY]
    assert main(args) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 6 and "greedy_bleu" in result and len(result["examples"]) == 5
    assert sorted(os.listdir(out / "checkpoints")) == [
        "best.json",
        "best.keras",
        "epoch-001.keras",
        "epoch-002.keras",
    ]
    # The export runs on TensorFlow, from the run's .keras file, and translates as the run did.
    export = [sys.executable, "-m", "pipelines", "export", "--run-dir", str(out), "--base",
              str(tmp_path / "saved"), "--name", "tiny", "--beam-size", "1"]  # fmt: skip
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "TF_CPP_MIN_LOG_LEVEL": "2"}
    exported = subprocess.run(export, cwd=ROOT, env=env, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr[-2000:]
    signature = tf.saved_model.load(str(tmp_path / "saved" / "tiny" / "1")).signatures
    examples = result["examples"]
    sources = tf.constant([example["source"] for example in examples])
    translations = signature["serving_default"](inputs=sources)["translations"].numpy()
    assert [t.decode() for t in translations] == [e["translation"] for e in examples]
    # The same global batches and initial weights on one device reach the same weights.
    config = load_config(config_file=str(out / "config.json"))
    train_dir, seed = str(out / "data" / "train"), config.optimization.seed
    data = batching.batch_examples(
        shards.read_examples(shards.read_manifest(train_dir), train_dir, shuffle=True, seed=seed),
        config.batching.batch_tokens,
        config.batching.max_length,
        repeat=True,
        seed=seed,
        shuffle_buffer=config.batching.shuffle_buffer,
        cache=False,
        fixed_shapes=True,
        row_multiple=2,
        ratio=JAX_BUCKET_RATIO,
    )
    history, model, trainer = train_on_one_device(config, out, data, steps=6, steps_per_epoch=3)
    assert history.history["loss"] == pytest.approx(result["history"]["loss"], abs=2e-5)
    validation_dir = str(out / "data" / "validation")
    validation = batching.batch_examples(
        shards.read_examples(shards.read_manifest(validation_dir), validation_dir),
        config.batching.batch_tokens,
        config.batching.max_length,
        shuffle=False,
        fixed_shapes=True,
        row_multiple=2,
        ratio=JAX_BUCKET_RATIO,
    )
    val_loss = trainer.evaluate(validation)["loss"]
    assert val_loss == pytest.approx(result["history"]["val_loss"][-1], abs=2e-5)
    # Adam (epsilon 1e-9) turns rounding noise in a near-zero gradient into a
    # whole step of the rate (about 1e-4 here): weights agree to that.
    trained = keras.saving.load_model(str(out / "checkpoints" / "epoch-002.keras"))
    for expected, actual in zip(trained.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(actual, expected, atol=1e-4)


def test_translations_of_a_jax_model_keep_input_order_and_blanks(tmp_path):
    sentences = ["5 kg", "", "10:21:00 PM, 3.3%", "  ", "44.6%"]
    path = train_sentencepiece(
        [s for s in sentences * 3 if s.strip()], str(tmp_path / "s.model"), vocabulary_size=24
    )
    model = random_transformer(np.array([[4, 5, 6, 3]]), vocabulary_size=24, num_layers=1, seed=3)
    tok = load_tokenizer(path)
    together = translate(model, tok, sentences, max_source_length=16, extra_length=5)
    for sentence, translation in zip(sentences, together, strict=True):
        if sentence.strip():
            assert translate(model, tok, [sentence], max_source_length=16, extra_length=5) == [
                translation
            ]
    assert together[1] == together[3] == ""
    assert len(set(together)) > 2  # distinct sentences get distinct outputs: the order counts


def test_mixed_float16_is_refused_before_any_work(tmp_path, capsys):
    out = tmp_path / "run"
    args = ["--output-dir", str(out), "--mixed-precision", "mixed_float16", *TINY]
    try:
        status = main(args)
    except SystemExit as exit_info:
        status = exit_info.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "use mixed_bfloat16" in err and "Traceback" not in err
    assert list(out.iterdir()) == []  # the command's checks made the folder; nothing written


@pytest.mark.slow
def test_a_run_killed_late_resumes_on_the_batches_it_would_have_read(tmp_path):
    # About 30 fixed-shape batches a pass: the kill comes after step 80, in the third pass.
    steps = ["--steps", "120", "--steps-per-epoch", "120", "--backup-every", "5"]
    flags = [*steps, *TINY, "--set", "heldout_split=none"]
    assert main(["--output-dir", str(tmp_path / "whole"), *flags]) == 0
    out = tmp_path / "run"
    command = [sys.executable, "-m", "pipelines", "train", "--output-dir", str(out), *flags]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}  # KERAS_BACKEND and XLA_FLAGS as here
    second = killed_and_resumed(
        command, ROOT, env, out / "backup", out / "result.json", after_step=80
    )
    assert second.returncode == 0, second.stderr[-2000:]
    result = json.loads((out / "result.json").read_text())
    assert 80 <= result["resumed_at_step"] < 120 and result["steps"] == 120
    assert f"Resuming at step {result['resumed_at_step']} of 120" in second.stderr
    assert "Skipping" not in second.stderr  # the stream's position was restored, not re-read
    whole, resumed = (keras.saving.load_model(d / "model.keras") for d in (tmp_path / "whole", out))
    for expected, actual in zip(whole.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)
