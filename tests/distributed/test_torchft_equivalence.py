"""torchft 0.2.0 and this project, run on the same model, data and optimizers: bit-identical.

torchft (``torchft.local_sgd.DiLoCo``, a dev dependency) is an independent implementation of DiLoCo
and Streaming DiLoCo. Two replicas (threads) each run it with a real ``Manager``, a real lighthouse
and a gloo process group on CPU; the same two replicas then run :class:`diloco.StreamingDiLoCo`
(in-process communicator) with ``schedule="torchft"``. Every per-step loss and every final
parameter must be equal bit for bit: this checks the outer gradient, the FP32 average, the outer
Nesterov step per fragment, the merge with alpha, and the timing of sends and merges.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from functools import partial

import pytest
import torch
from _replicas import single_thread
from _tiny import batches, make_model
from torch import nn

# torchft==0.2.0 is a pinned dev dependency (requirements-dev.txt): a missing install fails, never skips.
from torchft._torchft import LighthouseServer
from torchft.local_sgd import DiLoCo
from torchft.manager import Manager
from torchft.process_group import ProcessGroupGloo

from diloco import StreamingDiLoCo, run_replicas

pytestmark = pytest.mark.timeout(120)

STEPS = 12
INNER = partial(torch.optim.AdamW, lr=3e-2, weight_decay=0.1, betas=(0.9, 0.95))
OUTER = partial(torch.optim.SGD, lr=0.7, momentum=0.9, nesterov=True)


def _fragments(model: nn.Module, P: int) -> list[list[nn.Module]]:
    """P = 1: the model; P = 2: (embedding, final norm, head) and the blocks."""
    return [[model]] if P == 1 else [[model.embed, model.norm, model.head], [model.blocks]]


def _torchft_replica(replica: int, lighthouse: str, H: int, P: int, tau: int, alpha: float) -> dict:
    model = make_model(0)
    inner = INNER(model.parameters())
    frags = [nn.ModuleList(f) for f in _fragments(model, P)]
    outers = [OUTER(f.parameters()) for f in frags]
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=30)),
        min_replica_size=2,
        use_async_quorum=False,
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]), inner.load_state_dict(sd["inner"])),
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
        replica_id=str(replica),
        store_addr="127.0.0.1",
        store_port=store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=lighthouse,
        hostname="localhost",
        timeout=timedelta(seconds=30),
        quorum_timeout=timedelta(seconds=30),
        connect_timeout=timedelta(seconds=30),
        init_sync=False,  # both replicas build the same seeded model; no recovery at the first quorum
    )
    losses = []
    try:
        with DiLoCo(
            manager,
            frags,
            inner,
            outers,
            sync_every=H,
            backup_device=torch.device("cpu"),
            pin_memory=False,
            fragment_sync_delay=tau,
            fragment_update_alpha=alpha,
        ):
            for x, y in batches(replica, STEPS):
                _, loss = model(x, y)
                loss.backward()
                inner.step()
                inner.zero_grad()
                losses.append(loss.item())
    finally:
        manager.shutdown(wait=True)
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _diloco_replica(comm, H: int, P: int, tau: int, alpha: float) -> dict:
    model = make_model(0)
    inner = INNER(model.parameters())
    algo = StreamingDiLoCo(
        model,
        comm=comm,
        sync_every=H,
        num_fragments=P,
        overlap_steps=tau,
        merge_alpha=alpha,
        outer_optimizer=OUTER,
        fragments=_fragments(model, P),
        schedule="torchft",
    )
    losses = []
    for x, y in batches(comm.rank, STEPS):
        _, loss = model(x, y)
        loss.backward()
        inner.step()
        inner.zero_grad()
        algo.step()
        losses.append(loss.item())
    assert not algo.pending_fragments  # STEPS is a multiple of H: every exchange was merged, as in torchft
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def _run_torchft(H: int, P: int, tau: int, alpha: float) -> list[dict]:
    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=2)
    results: dict[int, dict] = {}
    errors: list[BaseException] = []

    def target(replica: int) -> None:
        try:
            results[replica] = _torchft_replica(replica, lighthouse.address(), H, P, tau, alpha)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(r,), daemon=True) for r in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=100)
    finally:
        lighthouse.shutdown()
    if errors:
        raise errors[0]
    assert len(results) == 2, "a torchft replica did not finish in time"
    return [results[0], results[1]]


@pytest.mark.parametrize("H, P, tau, alpha", [(4, 1, 0, 0.0), (4, 2, 1, 0.5)], ids=["diloco", "streaming"])
def test_bit_identical_to_torchft(H, P, tau, alpha):
    with single_thread():
        theirs = _run_torchft(H, P, tau, alpha)
        ours = run_replicas(lambda comm: _diloco_replica(comm, H, P, tau, alpha), 2, timeout=60)
    for r in range(2):
        assert ours[r]["losses"] == theirs[r]["losses"], f"replica {r}: losses differ"
        for name, value in theirs[r]["params"].items():
            assert torch.equal(ours[r]["params"][name], value), f"replica {r}: {name} differs"
    # not vacuous: the replicas trained on different data, and syncing made them meet
    assert ours[0]["losses"] != ours[1]["losses"]
    assert ours[0]["losses"][0] != ours[0]["losses"][-1]
