"""The docstring examples and the README's Python blocks run and show what they claim."""

import doctest
import importlib
import pathlib
import re

import keras
import numpy as np
import pytest

import keras_transformer
from tests.test_case import modules_with_examples

ROOT = pathlib.Path(__file__).resolve().parents[1]
MODULES = modules_with_examples("keras_transformer")


def test_every_layer_module_has_examples():
    names = {name for name, _ in MODULES}
    for layer in ("attention", "positional_encoding", "embedding", "feed_forward", "encoder"):
        assert f"keras_transformer.layers.{layer}" in names


@pytest.mark.parametrize("module_name, examples", MODULES)
def test_docstring_examples(module_name, examples):
    module = importlib.import_module(module_name)
    globs = {
        "keras": keras,
        **{n: getattr(keras_transformer, n) for n in keras_transformer.__all__},
    }
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted >= examples, f"{result.attempted} of {examples} examples ran"


def test_readme_examples(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) >= 2
    namespace = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    tokens = keras.ops.convert_to_numpy(namespace["tokens"])
    assert tokens.shape == (1, 4 + 50)
    assert (tmp_path / "translator.keras").exists()
    log_probs = keras.ops.convert_to_numpy(namespace["log_probs"])
    assert log_probs.shape == (1, 8000)
    np.testing.assert_allclose(np.exp(log_probs).sum(), 1.0, rtol=1e-4)
    classifier = namespace["classifier"]
    logits = classifier(np.array([[5, 6, 0, 0]]))
    assert tuple(logits.shape) == (1, 2)
