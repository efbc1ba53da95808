"""Package-wide rules: no TensorFlow under keras_transformer/, complete configs."""

import ast
import inspect
import pathlib

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
        "embedding_dim": 4,
        "num_heads": 2,
        "key_dim": 2,
        "intermediate_dim": 8,
        "num_layers": 1,
        "d_model": 8,
    }
    instance = cls(**{name: required[name] for name in parameters if name in required})
    config = instance.get_config()
    missing = [name for name in parameters if name not in config]
    assert not missing, f"{cls.__name__}.get_config() lacks {missing}"
