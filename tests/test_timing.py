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
