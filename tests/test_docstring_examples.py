"""Every docstring example in the package runs and shows what it says."""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import tfsparse

# Python modules only: the compiled kernel library is found here too.
ALL_MODULES = ["tfsparse"] + sorted(
    info.name
    for info in pkgutil.walk_packages(tfsparse.__path__, prefix="tfsparse.")
    if importlib.util.find_spec(info.name).origin.endswith(".py"))

# Public modules that show no example yet, and why (none today).
WITHOUT_EXAMPLES = {}


def _is_private(name):
    return any(part.startswith("_") for part in name.split("."))


def _examples(name):
    finder = doctest.DocTestFinder()
    return sum(len(test.examples) for test in finder.find(importlib.import_module(name)))


# Every public module shows its use; private modules (and the `python -m`
# entry points, `__main__`) are run when they have examples.
PUBLIC_MODULES = [name for name in ALL_MODULES
                  if not _is_private(name) and name not in WITHOUT_EXAMPLES]
PRIVATE_MODULES_WITH_EXAMPLES = [name for name in ALL_MODULES
                                 if _is_private(name) and _examples(name)]


@pytest.mark.parametrize("name", PUBLIC_MODULES + PRIVATE_MODULES_WITH_EXAMPLES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no docstring example"
    assert result.failed == 0, f"{result.failed} example(s) failed in {name}"


def test_modules_listed_without_examples_exist_and_still_have_none():
    for name in WITHOUT_EXAMPLES:
        assert name in ALL_MODULES
        assert _examples(name) == 0, f"{name} has examples now: remove it from WITHOUT_EXAMPLES"


def test_examples_are_found():
    assert len(PUBLIC_MODULES) > 40
    assert sum(_examples(name) for name in ALL_MODULES) > 100
