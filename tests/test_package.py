"""Package-wide rules: no TensorFlow under keras_transformer/, complete configs."""

import ast
import inspect
import os
import pathlib
import subprocess
import sys

import pytest

import keras_transformer

PACKAGE = pathlib.Path(keras_transformer.__file__).parent
PUBLIC_CLASSES = [
    getattr(keras_transformer, name)
    for name in keras_transformer.__all__
    if inspect.isclass(getattr(keras_transformer, name))
]


def test_nothing_under_keras_transformer_imports_tensorflow():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path}: {n}" for n in names if n.split(".")[0] == "tensorflow"]
    assert not offenders


@pytest.mark.parametrize("cls", PUBLIC_CLASSES, ids=lambda c: c.__name__)
def test_get_config_has_every_constructor_argument(cls):
    parameters = [
        name
        for name, p in inspect.signature(cls.__init__).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    required = {
        "vocabulary_size": 11,
        "hidden_dim": 4,
        "num_heads": 2,
        "key_dim": 2,
        "intermediate_dim": 8,
        "num_layers": 1,
    }
    instance = cls(**{name: required[name] for name in parameters if name in required})
    config = instance.get_config()
    missing = [name for name in parameters if name not in config]
    assert not missing, f"{cls.__name__}.get_config() lacks {missing}"


ROOT = PACKAGE.parent
# What the core must not need: the `tensorflow` and `test` extras.
EXTRAS = ("tensorflow", "tensorflow_text", "tensorflow_datasets", "keras_hub", "sacrebleu",
          "sentencepiece", "babel", "matplotlib", "ctranslate2")  # fmt: skip
CORE_CHECK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)")
sys.meta_path.insert(0, Block())
import numpy as np
import keras_transformer as kt
model = kt.Transformer(vocabulary_size=12, num_layers=1, hidden_dim=8, intermediate_dim=8,
                       num_heads=2)
model.build(((None, None), (None, None)))
tokens = kt.greedy_search(model, np.array([[5, 6, 3]]), extra_length=2)
print(tuple(tokens.shape))
"""


def test_core_imports_with_keras_numpy_and_one_backend():
    """keras_transformer runs on JAX with every package of the extras unimportable."""
    env = {**os.environ, "KERAS_BACKEND": "jax"}
    result = subprocess.run(
        [sys.executable, "-c", CORE_CHECK.format(blocked=EXTRAS)],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().endswith("(1, 5)")


def _setup_lists():
    tree = ast.parse((ROOT / "setup.py").read_text())
    return {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List)
    }


def test_core_requirements_are_keras_and_numpy_only():
    lists = _setup_lists()
    assert [r.split(">")[0] for r in lists["CORE"]] == ["keras", "numpy"]
    assert any(r.startswith("tensorflow>=") for r in lists["TENSORFLOW"])


def _code_lines(node):
    """Lines of a function or module, its docstring left out."""
    lines = node.end_lineno - node.lineno + 1
    docstring = node.body[0] if node.body and ast.get_docstring(node) is not None else None
    if docstring is not None:
        lines -= docstring.end_lineno - docstring.lineno + 1
    return lines


@pytest.mark.parametrize("package", ["keras_transformer", "pipelines"])
def test_modules_and_functions_stay_small(package):
    """At most 500 lines a module and 80 a function (docstrings aside)."""
    too_long = []
    for path in sorted((ROOT / package).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > 500:
            too_long.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _code_lines(node) > 80:
                too_long.append(f"{path.name}: {node.name} has {_code_lines(node)} lines")
    assert not too_long


def _private_attribute_reads(path):
    """`obj._name` reads (and `getattr(obj, "_name...")`) where `obj` is not `self` or `cls`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.JoinedStr) and name.values:
                name = name.values[0]
            if isinstance(name, ast.Constant) and str(name.value).startswith("_"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: getattr {name.value!r}")
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{node.attr}")
    return found


def test_nothing_outside_the_package_reads_private_attributes():
    """pipelines/ and benchmarks/ use the layers' public surface only."""
    paths = [p for folder in ("pipelines", "benchmarks") for p in (ROOT / folder).rglob("*.py")]
    offenders = [line for path in sorted(paths) for line in _private_attribute_reads(path)]
    assert not offenders, "\n".join(offenders)


def test_the_scan_finds_a_private_read(tmp_path):
    path = ROOT / "tests" / "_scan_probe.py"
    try:
        path.write_text(
            "def f(layer, self, n):\n"
            "    return layer._query_dense, self._ok, getattr(layer, f'_{n}_dense')\n"
        )
        assert _private_attribute_reads(path) == [
            "tests/_scan_probe.py:2: ._query_dense",
            "tests/_scan_probe.py:2: getattr '_'",
        ]
    finally:
        path.unlink()
