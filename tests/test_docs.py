"""The docstring examples and the README's Python blocks run and show what they claim."""

import doctest
import importlib
import pathlib
import re
import warnings

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


def run_python_blocks(path):
    """Runs a Markdown file's ```python blocks in order, in one namespace; returns it."""
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)
    assert blocks, f"{path} has no Python blocks"
    namespace = {}
    for block in blocks:
        exec(compile(block, str(path), "exec"), namespace)
    return namespace


def test_readme_examples(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace = run_python_blocks(ROOT / "README.md")
    # Only the libraries' own deprecation notices, which Python hides from users.
    shown = [f"{w.category.__name__}: {w.message}" for w in caught]
    assert not [
        w
        for w, c in zip(shown, caught, strict=True)
        if not issubclass(c.category, DeprecationWarning)
    ], shown
    tokens = keras.ops.convert_to_numpy(namespace["tokens"])
    assert tokens.shape == (1, 5 + 50)  # the source's length (EOS included) + 50
    assert (tmp_path / "translator.keras").exists()
    classifier = namespace["classifier"]
    logits = classifier(np.array([[5, 6, 0, 0]]))
    assert tuple(logits.shape) == (1, 2)


def test_the_decoding_guide_runs(tmp_path, monkeypatch):
    """docs/decoding.md's blocks check their own claims (cached equals full pass, rescoring)."""
    monkeypatch.chdir(tmp_path)
    namespace = run_python_blocks(ROOT / "docs" / "decoding.md")
    assert tuple(namespace["best"].shape)[:2] == (2, 2)


def test_the_decoding_controls_page_runs(tmp_path, monkeypatch):
    """docs/decoding-controls.md: the controls cut, and a prefix leads each beam output."""
    monkeypatch.chdir(tmp_path)
    namespace = run_python_blocks(ROOT / "docs" / "decoding-controls.md")
    tokens = np.asarray(namespace["prefixed"][0])  # (B, 1, T)
    np.testing.assert_array_equal(tokens[:, 0, 0], namespace["source_ids"][:, 0])
    assert not np.isin(np.asarray(namespace["controlled"]), [42]).any()


def test_every_python_block_in_the_docs_runs_in_a_test():
    """Core pages run here on every backend; pages that need TensorFlow in tests/pipelines."""
    # tf-serving.md's gRPC requests: tests/pipelines/serving/test_saved_model.py.
    tested = {
        "README.md",
        "decoding.md",
        "decoding-controls.md",
        "training.md",
        "tf-serving.md",
        "your-own-text.md",
    }
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    with_python = {p.name for p in pages if "```python" in p.read_text(encoding="utf-8")}
    assert with_python <= tested, with_python - tested


def test_your_own_text_runs_from_sentences_to_translations(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = run_python_blocks(ROOT / "docs" / "your-own-text.md")
    # The few pairs were learnt by heart: greedy and beam search give the targets back as text.
    assert namespace["translations"] == namespace["targets"]
    best = namespace["tokenizer"].decode(namespace["best"])  # (B, 2) hypotheses
    assert [hypotheses[0] for hypotheses in best] == namespace["targets"]
    # The saved model, loaded again, translates the same.
    again = namespace["vocabulary"].decode(namespace["again"])
    assert [hypotheses[0] for hypotheses in again] == namespace["targets"]
