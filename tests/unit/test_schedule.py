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
