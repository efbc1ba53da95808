"""The examples/ scripts run, on every backend, at tiny sizes."""

import importlib.util
import os
import pathlib

import keras
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def multi30k():
    if not MULTI30K.is_dir():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    return MULTI30K


def test_translate_your_text_trains_translates_and_saves(multi30k, tmp_path):
    example = load_example("translate_your_text")
    argv = ["--source", str(multi30k / "train.en.gz"), "--target", str(multi30k / "train.de.gz"),
            "--output-dir", str(tmp_path), "--pairs", "300", "--held-out", "4",
            "--vocabulary-size", "200", "--layers", "1", "--hidden-dim", "32", "--epochs", "1",
            "--batch-size", "32"]  # fmt: skip
    serving = keras.backend.backend() == "tensorflow"  # the export runs in a process of its own
    result = example.main(argv + ["--export"] if serving else argv)
    assert len(result["translations"]) == 4
    assert all(isinstance(text, str) for text in result["translations"])
    model = keras.saving.load_model(tmp_path / "model.keras")
    assert model.vocabulary_size == 200 and os.path.isfile(tmp_path / "vocab.model")
    if serving:  # the SavedModel's search is the script's: the same translations and scores
        assert result["served"] == result["translations"]
        np.testing.assert_allclose(result["served_scores"], result["scores"], rtol=1e-4)
