"""An exchange dropped by an elastic restart: at its finish step the fragment merges with the
unchanged global copy (a skipped sync, 0 bytes), and the next sync is a normal one. Hand-computed."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.local import run_replicas


class _Scalar(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))


def _algo(model, comm, alpha):
    return StreamingDiLoCo(
        model,
        comm=comm,
        sync_every=2,
        overlap_steps=1,
        merge_alpha=alpha,
        outer_optimizer=partial(torch.optim.SGD, lr=0.5),
    )


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_a_dropped_exchange_finishes_as_a_skipped_sync(alpha):
    c = [1.0, 3.0]  # replica r: w <- w - c_r each step

    def before(comm):  # M = 2: steps 1-2; step 2 starts fragment 0's exchange (tau = 1: finishes at 3)
        model = _Scalar()
        algo = _algo(model, comm, alpha)
        for _ in range(2):
            with torch.no_grad():
                model.w.sub_(c[comm.rank])
            algo.step()
        state = algo.state_dict()
        algo.flush()  # (drain the exchange so that the two threads end matched)
        return model.state_dict(), state

    (model0, state0), _ = run_replicas(before, 2, timeout=30)
    assert list(state0["pending"]) == [0] and "dropped_in_flight" not in state0
    state = dict(state0, pending={}, dropped_in_flight={0: int(state0["pending"][0]["started_at"])})

    def after(comm):  # M' = 1: replica 0's file, the exchange dropped
        model = _Scalar()
        algo = _algo(model, comm, alpha)
        model.load_state_dict(model0)
        algo.load_state_dict(state)
        assert algo.state_dict()["dropped_in_flight"] == {0: 2}  # kept until its finish step
        trace = []
        for _ in range(3):  # steps 3, 4, 5
            with torch.no_grad():
                model.w.sub_(c[0])
            reports = algo.step()
            trace.append((model.w.item(), algo.global_flat[0].item(), reports))
        return trace, algo.state_dict()

    [(trace, final)] = run_replicas(after, 1, timeout=30)
    w3 = alpha * (-3.0) + (1 - alpha) * 0.0  # step 3: merged with the unchanged global copy (0)
    (w, g, reports) = trace[0]
    assert (w, g) == pytest.approx((w3, 0.0))
    assert len(reports) == 1 and reports[0].skipped and reports[0].bytes_sent == reports[0].bytes_received == 0
    assert reports[0].started_at == 2
    w4 = w3 - 1.0  # step 4: a normal start, Delta = 0 - w4
    g5 = 0.0 - 0.5 * (0.0 - w4)
    w5 = alpha * (w4 - 1.0) + (1 - alpha) * g5
    assert trace[2][:2] == pytest.approx((w5, g5))
    assert not trace[2][2][0].skipped
    assert "dropped_in_flight" not in final
