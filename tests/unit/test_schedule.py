import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diloco.algorithm.schedule import Schedule


@st.composite
def configs(draw):
    H = draw(st.integers(1, 120))
    P = draw(st.integers(1, H))
    tau = draw(st.integers(0, H - 1))
    return H, P, tau


@settings(max_examples=200, deadline=None)
@given(configs())
def test_each_fragment_syncs_once_per_window_in_steady_state(cfg):
    H, P, tau = cfg
    s = Schedule(H, P, tau)
    # Steady state: any window of H consecutive steps after the first H.
    for w0 in (H + 1, 2 * H + 3, 5 * H - 1):
        counts = [0] * P
        for t in range(w0, w0 + H):
            for p in s.starts(t):
                counts[p] += 1
        assert counts == [1] * P


@settings(max_examples=200, deadline=None)
@given(configs())
def test_finishes_are_starts_plus_tau(cfg):
    H, P, tau = cfg
    s = Schedule(H, P, tau)
    starts = [(t, p) for t in range(1, 4 * H + 1) for p in s.starts(t)]
    finishes = [(t, p) for t in range(1, 4 * H + 1 + tau) for p in s.finishes(t)]
    assert sorted((t + tau, p) for t, p in starts) == sorted(finishes)


@settings(max_examples=200, deadline=None)
@given(configs())
def test_starts_are_spread_evenly(cfg):
    H, P, tau = cfg
    s = Schedule(H, P, tau)
    steps = sorted(t for t in range(H + 1, 3 * H + 1) for _ in s.starts(t))
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    # One sync every ~H/P steps: gaps differ by at most one step (a fragment per step at most).
    assert all(g in (H // P, -(-H // P)) for g in gaps), gaps
    assert all(len(s.starts(t)) <= 1 for t in range(1, 3 * H))


def test_plain_diloco_syncs_after_every_H_steps():
    s = Schedule(5)
    assert [t for t in range(1, 21) if s.starts(t)] == [5, 10, 15, 20]
    assert s.finishes(10) == (0,)


def test_example_offsets_and_pending():
    s = Schedule(12, 4, 2)
    assert s.offsets == (3, 6, 9, 12)
    assert s.starts(15) == (0,) and s.finishes(17) == (0,)
    assert s.pending_after(16) == (0,)


@pytest.mark.parametrize(
    "args, match",
    [((0, 1, 0), "H=0"), ((4, 0, 0), "P=0"), ((4, 5, 0), "P=5"), ((4, 2, 4), "tau=4"), ((4, 1, -1), "tau=-1")],
)
def test_invalid_combinations_name_the_values(args, match):
    with pytest.raises(ValueError, match=match):
        Schedule(*args)


def test_explicit_offsets_validated():
    assert Schedule(10, 2, 0, offsets=(4, 9)).starts(14) == (0,)
    with pytest.raises(ValueError, match="1..H"):
        Schedule(10, 2, 0, offsets=(0, 9))


# -- choosing the staggering: StreamingDiLoCo(schedule=...) ------------------------------------


def test_torchft_schedule_sends_tau_before_the_window_end_and_merges_on_it():
    """torchft 0.2.0: fragment p sends after (p+1) H/P - tau and merges after (p+1) H/P, every H steps."""
    H, P, tau = 12, 3, 2
    s = Schedule.torchft(H, P, tau)
    assert s.offsets == (2, 6, 10)
    for p in range(P):
        sends = [t for t in range(1, 3 * H + 1) if p in s.starts(t)]
        merges = [t for t in range(1, 3 * H + 1) if p in s.finishes(t)]
        assert sends == [(p + 1) * H // P - tau + k * H for k in range(3)]
        assert merges == [(p + 1) * H // P + k * H for k in range(3)]
    # the project's default sends where torchft merges
    assert Schedule(H, P, tau).offsets == (4, 8, 12)


@pytest.mark.parametrize(
    "H, P, tau, message",
    [
        (10, 3, 0, r"H=10\) to be a multiple of num_fragments \(P=3\).*H = 3 x k"),
        (8, 2, 4, r"0 <= overlap_steps \(tau=4\) < H/P = 4.*use tau <= 3"),
    ],
)
def test_torchft_schedule_rejects_what_torchft_rejects(H, P, tau, message):
    with pytest.raises(ValueError, match=message):
        Schedule.torchft(H, P, tau)


def test_resolve_schedule_accepts_each_form_and_names_bad_ones():
    from diloco.algorithm.schedule import resolve_schedule

    assert resolve_schedule(None, 8, 2, 1) == Schedule(8, 2, 1)
    assert resolve_schedule("even", 8, 2, 1) == Schedule(8, 2, 1)
    assert resolve_schedule("torchft", 8, 2, 1).offsets == (3, 7)
    assert resolve_schedule((2, 8), 8, 2, 1).offsets == (2, 8)
    assert resolve_schedule(Schedule(8, 2, 1, offsets=(1, 5)), 8, 2, 1).offsets == (1, 5)
    with pytest.raises(
        ValueError,
        match=r"schedule has \(H, P, tau\) = \(8, 2, 0\) but the algorithm was given "
        r"sync_every=8, num_fragments=2, overlap_steps=1",
    ):
        resolve_schedule(Schedule(8, 2, 0), 8, 2, 1)
    with pytest.raises(ValueError, match=r"offsets must lie in 1..H=8.*got \[9\]"):
        resolve_schedule((1, 9), 8, 2, 1)
    with pytest.raises(ValueError, match=r"offsets \(1,\) has 1 entries but num_fragments is 2"):
        resolve_schedule((1,), 8, 2, 1)
    with pytest.raises(ValueError, match=r"schedule='torchtf': use 'even', 'torchft'"):
        resolve_schedule("torchtf", 8, 2, 1)
    with pytest.raises(ValueError, match=r"must be integers"):
        resolve_schedule((1.5, 4), 8, 2, 1)


def test_a_configs_schedule_error_names_the_schedule_once():
    """The config's message prefixes ``schedule=...`` only where the schedule's own message does not start so."""
    from diloco.errors import ConfigError
    from diloco.train.config import TrainConfig

    base = dict(method="streaming", steps=10, sync_every=8, num_fragments=1, overlap_steps=1)
    for schedule, expected in (
        ("bogus", "schedule='bogus': use 'even', 'torchft', a tuple of 1 offsets in 1..8, or a Schedule"),
        ("9", "schedule='9': offsets must lie in 1..H=8"),
    ):
        with pytest.raises(ConfigError) as info:
            TrainConfig(**base, schedule=schedule)
        message = str(info.value)
        assert expected in message and message.count("schedule=") == 1, message


def test_streaming_diloco_runs_the_schedule_it_is_given():
    """Offsets change when fragments sync, and a bad schedule fails before any communication."""
    import torch
    from _tiny import TinyNet

    from diloco import StreamingDiLoCo, run_replicas

    def replica(comm, schedule):
        torch.manual_seed(0)
        model = TinyNet()
        algo = StreamingDiLoCo(model, comm=comm, sync_every=4, num_fragments=2, overlap_steps=1, schedule=schedule)
        done = []
        for _ in range(8):
            done += [(r.started_at, r.step, r.fragment) for r in algo.step()]
        return done

    assert run_replicas(lambda c: replica(c, None), 1)[0] == [(2, 3, 0), (4, 5, 1), (6, 7, 0)]
    assert run_replicas(lambda c: replica(c, "torchft"), 1)[0] == [(1, 2, 0), (3, 4, 1), (5, 6, 0), (7, 8, 1)]
    with pytest.raises(ValueError, match="offsets must lie in 1..H=4"):
        run_replicas(lambda c: replica(c, (0, 4)), 1)
