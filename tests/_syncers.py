"""A small syncer driven through rounds of reports, the same on any device (``syncer_device`` tests, unit and GPU)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from diloco.decoupled.messages import Report
from diloco.decoupled.syncer import Syncer
from diloco.wire.registry import get_codec


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(40, 16)  # averaged under RDA
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 32, bias=False)


def small_syncer(device: str, *, codec: str = "fp4_e3m0", merge: str = "rda", M: int = 3, K: int = 2) -> Syncer:
    torch.manual_seed(0)
    model = Model()
    syncer = Syncer(
        model,
        num_learners=M,
        quorum=K,
        num_fragments=2,
        fragments=[[model.embed, model.a], [model.b]],
        merge=merge,
        codec=codec,
        grace_gamma=0.0,
        guard="off",
        device=device,
    )
    for m in range(M):
        syncer.join(m)
    return syncer


def drive(syncer: Syncer, *, rounds: int, codec: str, first: int = 0) -> list[Any]:
    """``rounds`` rounds of both fragments, K of the M learners each (rotating, so learners hold different versions
    and Theta drifts from their copies); the same reports whatever the syncer's device. Returns every reply."""
    c, K, M = get_codec(codec), syncer.quorum, syncer.num_learners
    replies, merges = [], len(syncer.records)
    for rnd in range(first, first + rounds):
        for p, numel in enumerate(syncer.fragment_sizes()):
            for m in sorted((rnd * K + p + j) % M for j in range(K)):
                gen = torch.Generator().manual_seed(100 * rnd + 10 * p + m)
                steps = 4 + m + rnd % 2
                report = Report(
                    learner=m,
                    fragment=p,
                    payload=c.encode(torch.randn(numel, generator=gen).mul_(1e-2 * (1 + 0.3 * m))),
                    steps=steps,
                    tokens=64.0 * steps + 7 * m,
                    step_time=0.0,
                    sent_after_step=10 * (rnd + 1),
                    base_version=syncer._held[m][p],
                )
                replies += syncer.receive(report)
    assert len(syncer.records) == merges + 2 * rounds, "every round merged"
    return replies


def tensors(tree: Any) -> Iterator[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from tensors(v)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            yield from tensors(v)


def state_tensors(syncer: Syncer) -> list[torch.Tensor]:
    """Every tensor the syncer holds between merges: Theta, its snapshots, the momentum, the learners' copies."""
    return [
        *syncer.global_flat,
        *syncer._snapshot,
        *tensors([o.state_dict()["state"] for o in syncer.outer_optimizers]),
        *tensors(syncer._base),
    ]


def saved(state: dict[str, Any]) -> dict[str, Any]:
    buf = io.BytesIO()
    torch.save(state, buf)
    return torch.load(io.BytesIO(buf.getvalue()), weights_only=True, map_location="cpu")


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    ta, tb = list(tensors(a)), list(tensors(b))
    assert len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb, strict=True))
    strip = {k: v for k, v in a.items() if k not in ("global", "outer_optimizers", "bases")}
    assert strip == {k: v for k, v in b.items() if k not in ("global", "outer_optimizers", "bases")}
    # learners that share a copy still share one (a checkpoint holds each copy once)
    assert len({id(t) for t in tensors(a["bases"])}) == len({id(t) for t in tensors(b["bases"])})


def check_state_devices(device: str) -> None:
    """The syncer's state on ``device`` after rounds of merges; replies, welcomes, parameters and state on the CPU."""
    syncer = small_syncer(device)
    replies = drive(syncer, rounds=3, codec="fp4_e3m0")
    assert syncer.device.type == device
    held = state_tensors(syncer)
    assert len(held) >= 2 * 2 + 2 and {t.device.type for t in held} == {device}
    assert any(syncer._base[m][p] is not syncer._snapshot[p] for m in range(3) for p in range(2)), "copies differ"
    assert replies and {r.payload.device.type for r in replies} == {"cpu"}
    assert {f.device.type for f in syncer.join(0).fragments} == {"cpu"}
    assert {v.device.type for v in syncer.global_named_parameters().values()} == {"cpu"}
    assert {t.device.type for t in tensors(syncer.state_dict())} == {"cpu"}


def check_round_trip(src: str, dst: str) -> None:
    """A state saved by a syncer on ``src`` (loaded from bytes onto the CPU, as a machine without a GPU would) and
    restored into one on ``dst``: the same state, its tensors on ``dst``, and on one device the next merge the same
    bits."""
    a = small_syncer(src)
    drive(a, rounds=3, codec="fp4_e3m0")
    state = saved(a.state_dict())
    b = small_syncer(dst)
    b.load_state_dict(state)
    assert {t.device.type for t in state_tensors(b)} == {dst}
    assert_same_state(b.state_dict(), state)
    if src == dst:  # the restored syncer goes on exactly as the one it was saved from
        drive(a, rounds=1, codec="fp4_e3m0", first=3)
        drive(b, rounds=1, codec="fp4_e3m0", first=3)
        assert all(torch.equal(x, y) for x, y in zip(a.global_flat, b.global_flat, strict=True))
