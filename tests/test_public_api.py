import importlib

import pytest

import tfsparse

PACKAGES = [
    "tfsparse",
    "tfsparse.compression",
    "tfsparse.data",
    "tfsparse.distribute",
    "tfsparse.dynamic",
    "tfsparse.export",
    "tfsparse.fssl",
    "tfsparse.graphchallenge",
    "tfsparse.horovod",
    "tfsparse.layers",
    "tfsparse.ops",
    "tfsparse.partition",
    "tfsparse.regularizers",
    "callbacks",
]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_listed_public_name_exists(name):
    module = importlib.import_module(name)
    assert module.__all__, name
    for public in module.__all__:
        assert hasattr(module, public), f"{name}.{public}"


def test_version():
    assert tfsparse.__version__ == "0.1.0"
