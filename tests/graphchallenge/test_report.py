"""Tests of the challenge's one-line result and the peak memory."""

import re

import numpy as np
import pytest

from tfsparse.graphchallenge import parse_result_line
from tfsparse.graphchallenge import peak_rss_bytes
from tfsparse.graphchallenge import result_line


def test_result_line_fields_and_rate():
    line = result_line(4096, 480, 62914560, 60000, 12.5, peak_rss=3 * 2**30)
    # 60,000 * 62,914,560 / 12.5 = 3.01989888e11
    assert line == ("RESULT neurons=4096 layers=480 edges=62914560 inputs=60000 seconds=12.5 "
                    "edges_per_second=3.0199e+11 peak_rss_mib=3072")
    assert parse_result_line(line) == {
        "neurons": 4096, "layers": 480, "edges": 62914560, "inputs": 60000, "seconds": 12.5,
        "edges_per_second": 3.0199e11, "peak_rss_mib": 3072}


@pytest.mark.parametrize("name, value", [("neurons", 0), ("layers", 2.0), ("edges", -1),
                                         ("inputs", 0), ("seconds", 0.0),
                                         ("seconds", float("inf"))])
def test_result_line_rejects_bad_values(name, value):
    arguments = {"neurons": 1024, "layers": 120, "edges": 3932160, "inputs": 5000, "seconds": 1.0}
    arguments[name] = value
    expected = "a positive number" if name == "seconds" else "a positive integer"
    with pytest.raises(ValueError, match=re.escape(
            f'Received an invalid value for "{name}", expected {expected}. Received: {name}={value!r}')):
        result_line(**arguments)


def test_a_short_run_reads_back_as_it_was_written():
    # Four decimals wrote a nanosecond as seconds=0.0000.
    assert parse_result_line(result_line(16, 2, 64, 1, 1e-9))["seconds"] == 1e-9


FIELDS = "neurons=1024 layers=2 edges=65536 inputs=10 edges_per_second=1.3107e+06"


@pytest.mark.parametrize("line", [
    "neurons=1", "RESULT neurons=1 speed=3", "RESULT neurons",
    f"RESULT {FIELDS} seconds=0.5 seconds=0.6",  # repeated
    "RESULT neurons=1024 layers=2 inputs=10 seconds=0.5",  # missing fields
    f"RESULT {FIELDS} seconds=inf", f"RESULT {FIELDS} seconds=abc",
    # Counts are integers (1.5 neurons and 1e3 inputs were read as floats).
    "RESULT neurons=1.5 layers=2 edges=65536 inputs=10 seconds=0.5 edges_per_second=1",
    "RESULT neurons=1024 layers=2 edges=65536 inputs=1e3 seconds=0.5 edges_per_second=1",
])
def test_parse_result_line_rejects_other_lines(line):
    with pytest.raises(ValueError, match='Received an invalid value for "line"'):
        parse_result_line(line)


def test_peak_rss_sees_arrays_outside_python_allocators():
    before = peak_rss_bytes()
    block = np.ones(before // 8 + 64 * 2**20 // 8)  # more than the whole process so far, touched
    assert peak_rss_bytes() >= block.nbytes
    del block


def test_peak_memory_is_written_as_the_parser_reads_it():
    # Under half a MiB was written as peak_rss_mib=0, which the parser refused;
    # a negative peak was written as -0.
    assert parse_result_line(result_line(16, 2, 64, 1, 1.0, 100))["peak_rss_mib"] == 1
    assert parse_result_line(result_line(16, 2, 64, 1, 1.0, 3 * 2**20))["peak_rss_mib"] == 3
    for bad in (-5, 0, float("nan"), True):
        with pytest.raises(ValueError, match='Received an invalid value for "peak_rss"'):
            result_line(16, 2, 64, 1, 1.0, bad)
    line = "RESULT neurons=16 layers=2 edges=64 inputs=1 seconds=1 edges_per_second=1E5"
    assert parse_result_line(line)["edges_per_second"] == 1e5
