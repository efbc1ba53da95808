"""The docstring examples under pipelines/ run and show what they claim."""

import doctest
import importlib

import pytest

from tests.test_case import modules_with_examples

MODULES = modules_with_examples("pipelines")


def test_the_library_modules_have_examples():
    names = {name for name, _ in MODULES}
    assert {"pipelines.data.default_corpus", "pipelines.training.trainer"} <= names


@pytest.mark.parametrize("module_name, examples", MODULES)
def test_docstring_examples(module_name, examples):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted >= examples, f"{result.attempted} of {examples} examples ran"
