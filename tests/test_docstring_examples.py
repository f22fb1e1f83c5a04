"""Every docstring example in the package runs and shows what it says."""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import tfsparse

# Python modules only: the compiled kernel library is found here too.
MODULES = sorted(
    info.name
    for info in pkgutil.walk_packages(tfsparse.__path__, prefix="tfsparse.")
    if importlib.util.find_spec(info.name).origin.endswith(".py"))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{result.failed} example(s) failed in {name}"


def test_examples_are_found():
    finder = doctest.DocTestFinder()
    examples = sum(len(test.examples)
                   for name in MODULES
                   for test in finder.find(importlib.import_module(name)))
    assert examples > 100
