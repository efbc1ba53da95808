"""The docstring examples under pipelines/ run and show what they claim."""

import doctest
import importlib

import pytest

from tests.test_case import package_modules

MODULES = package_modules("pipelines")


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples(module_name):
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
