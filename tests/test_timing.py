"""tfsparse._timing: the benchmarks' interleaved timing, on a fake clock."""

import types

import pytest

from tfsparse import _timing


def switching_candidates(monkeypatch, names):
    """Candidates on a fake clock: a call costs 1.0 after another candidate's, 0.1 after its own."""
    clock = {"now": 0.0, "last": None}
    monkeypatch.setattr(_timing, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"]))

    def candidate(name):
        def call():
            clock["now"] += 0.1 if clock["last"] == name else 1.0
            clock["last"] = name
        return call

    return {name: candidate(name) for name in names}


def test_one_call_a_turn_pays_for_switching_from_the_candidate_before(monkeypatch):
    # Three candidates shuffled per round: one follows itself only across a
    # round boundary, at most every other round, so most of its calls switch.
    candidates = switching_candidates(monkeypatch, "abc")
    medians = _timing.interleaved_medians(candidates, repeats=5, warmup=0)
    assert medians == pytest.approx({"a": 1.0, "b": 1.0, "c": 1.0})


def test_back_to_back_calls_time_the_candidates_steady_state(monkeypatch):
    candidates = switching_candidates(monkeypatch, "abc")
    medians = _timing.interleaved_medians(candidates, repeats=5, warmup=0, calls=2)
    assert medians == pytest.approx({"a": 0.1, "b": 0.1, "c": 0.1})


def test_calls_below_one_are_an_error():
    with pytest.raises(ValueError, match="calls must be at least 1, received 0"):
        _timing.interleaved_medians({"a": lambda: None}, calls=0)


def test_an_op_below_the_timers_resolution_is_an_error_not_a_negative_time(monkeypatch):
    # benchmarks/kernel_time.py printed "avx512 -0.2169 ms" for a tiny op.
    import pathlib
    import sys

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parents[1] / "benchmarks"))
    import kernel_time

    monkeypatch.setattr(kernel_time, "looped", lambda op, inputs, iterations, variant: None)
    ops = {"a": (None, (), None), "b": (None, (), None)}
    medians = {"a x1": 1.0, "a x11": 3.0, "b x1": 1.0, "b x11": 0.9}
    monkeypatch.setattr(kernel_time, "interleaved_medians", lambda loops, repeats: medians)
    with pytest.raises(RuntimeError, match="took no longer than one call for b"):
        kernel_time.per_op_seconds(ops, repeats=3)
    medians["b x11"] = 2.0
    assert kernel_time.per_op_seconds(ops, repeats=3) == pytest.approx({"a": 0.2, "b": 0.1})
    del sys.modules["kernel_time"]
