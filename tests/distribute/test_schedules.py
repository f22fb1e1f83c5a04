"""Pipeline schedules as data: invariants of every schedule, delays, errors."""

import collections
import itertools

import pytest

from tfsparse.distribute import SCHEDULES
from tfsparse.distribute import schedule
from tfsparse.distribute import simulate
from tfsparse.distribute import update_delays
from tfsparse.distribute import schedules as S

CASES = [(name, p, m, steps) for name in SCHEDULES
         for p, m, steps in [(1, 1, 1), (1, 3, 2), (2, 1, 3), (2, 4, 2), (3, 2, 3),
                             (4, 4, 2), (4, 8, 1), (5, 3, 3)]]


def positions(actions):
    return {(a.kind, a.microbatch): i for i, a in enumerate(actions) if a.microbatch >= 0}


@pytest.mark.parametrize("name,p,m,steps", CASES)
def test_every_compute_action_once_in_order(name, p, m, steps):
    sched = schedule(name, p, m, steps)
    total = m * steps
    for stage, actions in enumerate(sched.actions):
        assert all(a.stage == stage for a in actions)
        counts = collections.Counter((a.kind, a.microbatch) for a in actions
                                     if a.kind in (S.FORWARD, S.BACKWARD_INPUT,
                                                   S.BACKWARD_WEIGHT))
        expected = {(kind, mb): 1 for kind in (S.FORWARD, S.BACKWARD_INPUT, S.BACKWARD_WEIGHT)
                    for mb in range(total)}
        assert counts == expected
        where = positions(actions)
        for mb in range(total):
            assert (where[(S.FORWARD, mb)] < where[(S.BACKWARD_INPUT, mb)]
                    < where[(S.BACKWARD_WEIGHT, mb)])
        # Updates partition the micro-batches and follow their weight gradients.
        updated = []
        for i, action in enumerate(actions):
            if action.kind == S.UPDATE:
                assert all(where[(S.BACKWARD_WEIGHT, mb)] < i for mb in action.microbatches)
                updated += action.microbatches
        assert sorted(updated) == list(range(total))


@pytest.mark.parametrize("name,p,m,steps", CASES)
def test_sends_and_receives_pair_up_between_neighbours(name, p, m, steps):
    sched = schedule(name, p, m, steps)
    sends = collections.Counter()
    receives = collections.Counter()
    for stage, actions in enumerate(sched.actions):
        for a in actions:
            if a.kind in S.RECEIVES:
                send_kind, offset = S.RECEIVES[a.kind]
                assert 0 <= stage + offset < p
                receives[(send_kind, stage + offset, a.microbatch, a.microbatches)] += 1
            elif a.kind.startswith("send_"):
                sends[(a.kind, stage, a.microbatch, a.microbatches)] += 1
    assert sends == receives
    assert set(sends.values()) <= {1}
    # A stage receives activations for exactly its forwards (none on stage 0).
    for stage, actions in enumerate(sched.actions):
        got = [a.microbatch for a in actions if a.kind == S.RECEIVE_ACTIVATION]
        assert got == ([] if stage == 0 else
                       [a.microbatch for a in actions if a.kind == S.FORWARD])


@pytest.mark.parametrize("name,p,m,steps", CASES)
def test_replay_respects_dependencies_across_stages(name, p, m, steps):
    result = simulate(name, [(1.0, 2.0, 1.5)] * p, p, m, steps)
    times = {(a.kind, a.stage, a.microbatch): (start, end)
             for a, start, end in result.timeline}
    split = name == "layerpipe"
    for mb in range(m * steps):
        for stage in range(1, p):
            assert times[(S.FORWARD, stage, mb)][0] >= times[(S.FORWARD, stage - 1, mb)][1]
            sender = S.BACKWARD_INPUT if split else S.BACKWARD_WEIGHT
            assert (times[(S.BACKWARD_INPUT, stage - 1, mb)][0]
                    >= times[(sender, stage, mb)][1])
        for stage in range(p):  # one action at a time per stage
            spans = sorted((s, e) for (k, st, _), (s, e) in times.items() if st == stage)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_synchronous_schedules_flush_every_step(name):
    sched = schedule(name, 3, 4, steps=2)
    for actions in sched.actions:
        where = positions(actions)
        update_at = [i for i, a in enumerate(actions) if a.kind == S.UPDATE]
        assert len(update_at) == 2
        assert max(where[(S.BACKWARD_WEIGHT, mb)] for mb in range(4)) < update_at[0]
        assert min(where[(S.FORWARD, mb)] for mb in range(4, 8)) > update_at[0]
    assert update_delays(sched) == (0, 0, 0)


def test_1f1b_order_on_each_stage():
    # PipeDream-Flush: stage s runs P - s forwards, then alternates.
    sched = schedule("1f1b", 3, 5)
    compact = [[f"{a.kind[0].upper()}{a.microbatch}" for a in actions
                if a.kind in (S.FORWARD, S.BACKWARD_INPUT)] for actions in sched.actions]
    assert compact[0] == "F0 F1 F2 B0 F3 B1 F4 B2 B3 B4".split()
    assert compact[1] == "F0 F1 B0 F2 B1 F3 B2 F4 B3 B4".split()
    assert compact[2] == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4".split()


def test_gpipe_runs_all_forwards_first():
    sched = schedule("gpipe", 2, 3)
    kinds = [a.kind for a in sched.actions[0]
             if a.kind in (S.FORWARD, S.BACKWARD_INPUT)]
    assert kinds == [S.FORWARD] * 3 + [S.BACKWARD_INPUT] * 3


def test_layerpipe_sends_gradient_before_weight_gradient_pipedream_after():
    for name, between in (("layerpipe", True), ("pipedream", False)):
        actions = schedule(name, 2, 2).actions[1]
        where = positions(actions)
        sent = where[(S.SEND_GRADIENT, 0)]
        assert (where[(S.BACKWARD_INPUT, 0)] < sent < where[(S.BACKWARD_WEIGHT, 0)]) == between
        assert (sent > where[(S.BACKWARD_WEIGHT, 0)]) == (not between)


@pytest.mark.parametrize("name", ["pipedream", "layerpipe", "async"])
@pytest.mark.parametrize("p,m", [(3, 1), (4, 1), (4, 2), (5, 3), (6, 4)])
def test_update_delays_match_the_stated_delay(name, p, m):
    sched = schedule(name, p, m, steps=12)
    assert update_delays(sched) == tuple(S.stated_delay(name, s, p, m) for s in range(p))


def test_pipedream_delay_is_stages_after_with_one_microbatch_per_update():
    # LayerPipe2's retiming: 2 * S(l) forward-or-backward steps = S micro-batches.
    assert update_delays(schedule("pipedream", 5, 1, steps=10)) == (4, 3, 2, 1, 0)


def test_async_bounds_and_update_interval():
    sched = schedule("async", 4, 2, steps=4, min_update_interval=3, max_in_flight=2)
    for actions in sched.actions:
        groups = [a.microbatches for a in actions if a.kind == S.UPDATE]
        assert groups == [(0, 1, 2), (3, 4, 5), (6, 7)]
    stage0 = sched.actions[0]
    held = peak = 0
    for a in stage0:
        held += (a.kind == S.FORWARD) - (a.kind == S.BACKWARD_INPUT)
        peak = max(peak, held)
    assert peak == 2


def test_async_defaults_equal_pipedream_order():
    a = schedule("async", 3, 4, steps=3)
    b = schedule("pipedream", 3, 4, steps=3)
    assert a.actions == b.actions


def test_layerpipe_transfers_weight_gradients_before_each_update():
    sched = schedule("layerpipe", 3, 2, steps=2)
    for stage, actions in enumerate(sched.actions):
        for i, a in enumerate(actions):
            if a.kind == S.UPDATE and stage > 0:
                previous = actions[i - 1]
                assert previous.kind == S.RECEIVE_WEIGHT_GRADIENT
                assert previous.microbatches == a.microbatches


@pytest.mark.parametrize("kwargs,message", [
    (dict(name="zero-bubble", num_stages=2, num_microbatches=2),
     "Received an invalid value for \"name\", expected one of 'gpipe', '1f1b', "
     "'pipedream', 'layerpipe', 'async'. Received: name='zero-bubble'"),
    (dict(name="gpipe", num_stages=0, num_microbatches=2),
     'Received an invalid value for "num_stages", expected a positive integer. '
     'Received: num_stages=0'),
    (dict(name="gpipe", num_stages=2, num_microbatches=2.5),
     'Received an invalid value for "num_microbatches", expected a positive '
     'integer. Received: num_microbatches=2.5'),
    (dict(name="gpipe", num_stages=2, num_microbatches=2, steps=True),
     'Received an invalid value for "steps", expected a positive integer. '
     'Received: steps=True'),
    (dict(name="1f1b", num_stages=2, num_microbatches=2, min_update_interval=2),
     'Received an invalid value for "min_update_interval", expected None unless '
     'name="async". Received: min_update_interval=2'),
    (dict(name="async", num_stages=2, num_microbatches=2, max_in_flight=0),
     'Received an invalid value for "max_in_flight", expected a positive integer. '
     'Received: max_in_flight=0'),
])
def test_bad_arguments_raise_keras_style_errors(kwargs, message):
    with pytest.raises(ValueError) as error:
        schedule(**kwargs)
    assert str(error.value) == message


def test_schedules_are_pure_functions():
    for name, p, m in itertools.product(SCHEDULES, (2, 3), (2, 4)):
        assert schedule(name, p, m, 2) == schedule(name, p, m, 2)
