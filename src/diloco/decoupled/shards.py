"""A sharded syncer: the P fragments divided among S syncers, each an ordinary :class:`Syncer` of its own.

Fragment p belongs to shard ``p % S``, where it is fragment ``p // S`` (strided, as the schedule staggers the
fragments: fragments that fall due one after another go to different shards). S must divide P, so every shard
owns P / S fragments. A shard is a :class:`~diloco.decoupled.syncer.Syncer` built on the same model with only
its fragments trainable: its own Theta, outer optimizers, rounds, grace window, guard and checkpoints; shards
never talk to each other, so each may run on its own thread, process or machine (a Ray actor each).

A learner talks to the S shards through one :class:`ShardedChannel`: it joins every shard (the welcome is
theirs put together), sends each fragment's report to the shard that owns it and takes the reply from there.
The merge of a fragment depends only on that fragment's reports and state, so with K = M (where grace windows
do not decide who is merged) a run of S shards is the run of one syncer, bit for bit. With K < M the grace
window's moving averages are each shard's own (of its own fragments' rounds), so the windows, and hence who
makes a merge, may differ from one syncer's.

A shard that stops (killed, restarting from its checkpoint) holds up only its own fragments: the learners'
reports of the others are merged and answered as before, and a learner waits only where the schedule needs a
reply from the shard that is down.

S = 1 is the syncer itself, with no channel in between (nothing changes, file names included).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from torch import nn

from diloco.algorithm.fragments import FragmentSpec, Pattern, split_fragments
from diloco.decoupled.learner import Channel
from diloco.decoupled.messages import MergeRecord, Reply, Report, Welcome
from diloco.shard_rule import check_syncer_shards

T = TypeVar("T")


def shard_of(fragment: int, num_shards: int) -> int:
    """The shard that owns fragment ``fragment``."""
    return fragment % num_shards


def local_fragment(fragment: int, num_shards: int) -> int:
    """Fragment ``fragment``'s number inside its shard."""
    return fragment // num_shards


def global_fragment(shard: int, local: int, num_shards: int) -> int:
    """The fragment that is fragment ``local`` of shard ``shard``."""
    return local * num_shards + shard


def shard_name(name: str, shard: int, num_shards: int) -> str:
    """The name of shard ``shard`` of the syncer ``name`` (a Ray actor's; ``name`` itself when there is one)."""
    return name if num_shards == 1 else f"{name}-shard{shard}"


def owned_fragments(shard: int, num_shards: int, num_fragments: int) -> list[int]:
    """The fragments shard ``shard`` owns, in its own order."""
    return list(range(shard, num_fragments, num_shards))


@contextlib.contextmanager
def _only_trainable(model: nn.Module, names: set[str]) -> Iterator[nn.Module]:
    """``model`` with only the parameters ``names`` trainable (``requires_grad``), as it was afterwards."""
    params = list(model.named_parameters())
    before = [p.requires_grad for _, p in params]
    try:
        for (n, p), grad in zip(params, before, strict=True):
            p.requires_grad_(grad and n in names)
        yield model
    finally:
        for (_, p), grad in zip(params, before, strict=True):
            p.requires_grad_(grad)


def build_shards(
    model: nn.Module,
    *,
    num_shards: int,
    num_fragments: int,
    fragment_pattern: Pattern = "strided",
    fragments: FragmentSpec | None = None,
    build: Callable[[nn.Module, int, list[list[str]]], T],
    only: int | None = None,
) -> list[T]:
    """One syncer per shard: ``build(model, n, groups)`` with ``model`` showing only the shard's parameters as
    trainable and ``groups`` the names of its ``n`` fragments (as :func:`split_fragments` splits ``model`` into
    ``num_fragments``), e.g. ``lambda m, n, g: Syncer(m, num_fragments=n, fragments=g, num_learners=M)``.
    ``only``: shard ``only``'s alone (a list of one: what a shard's own process builds)."""
    check_syncer_shards(num_shards, num_fragments)
    assert only is None or 0 <= only < num_shards, f"shard {only} of {num_shards}"
    groups = [
        list(f.names) for f in split_fragments(model, num_fragments, pattern=fragment_pattern, fragments=fragments)
    ]
    out = []
    for s in range(num_shards) if only is None else [only]:
        owned = [groups[p] for p in owned_fragments(s, num_shards, num_fragments)]
        with _only_trainable(model, {n for g in owned for n in g}):
            out.append(build(model, len(owned), owned))
    return out


def combine_welcomes(welcomes: Sequence[Welcome]) -> Welcome:
    """The welcome of S shards (one each, in shard order) as one syncer's: fragments in global order."""
    S = len(welcomes)
    P = sum(len(w.fragments) for w in welcomes)
    pick = [(shard_of(p, S), local_fragment(p, S)) for p in range(P)]
    return Welcome(
        fragments=[welcomes[s].fragments[q] for s, q in pick],
        versions=[welcomes[s].versions[q] for s, q in pick],
        incarnation=max(w.incarnation for w in welcomes),
        step=max(w.step for w in welcomes),
    )


def combine_records(records: Sequence[Sequence[MergeRecord]]) -> list[MergeRecord]:
    """The merge records of S shards (a list each, in shard order), fragments numbered globally, in the order the
    merges happened (their wall time; a shard's own order where equal)."""
    S = len(records)
    if S == 1:
        return list(records[0])
    rows = [
        (r.at, s, i, dataclasses.replace(r, fragment=global_fragment(s, r.fragment, S)))
        for s, rs in enumerate(records)
        for i, r in enumerate(rs)
    ]
    return [r for *_, r in sorted(rows, key=lambda row: row[:3])]


class ShardedChannel:
    """One learner's :class:`~diloco.decoupled.learner.Channel` to S shards: ``channels[s]`` is its channel to
    shard s (any transport). Reports go to the shard that owns their fragment, numbered as it numbers them;
    replies come back numbered globally."""

    def __init__(self, channels: Sequence[Channel]) -> None:
        assert channels, "a sharded channel needs a channel per shard"
        self.channels = list(channels)
        self.num_shards = len(self.channels)

    def _route(self, fragment: int) -> tuple[Channel, int]:
        return self.channels[shard_of(fragment, self.num_shards)], local_fragment(fragment, self.num_shards)

    def _global(self, reply: Reply | None, fragment: int) -> Reply | None:
        return None if reply is None else dataclasses.replace(reply, fragment=fragment)

    def join(self) -> Welcome:
        return combine_welcomes([c.join() for c in self.channels])

    def send(self, report: Report) -> None:
        channel, q = self._route(report.fragment)
        channel.send(dataclasses.replace(report, fragment=q))

    def wait_reply(self, fragment: int) -> Reply:
        channel, q = self._route(fragment)
        reply = self._global(channel.wait_reply(q), fragment)
        assert reply is not None
        return reply

    def poll_reply(self, fragment: int) -> Reply | None:
        channel, q = self._route(fragment)
        return self._global(channel.poll_reply(q), fragment)

    def leave(self, **kw: Any) -> None:
        """Leave every shard (``kw``: what the shards' channels take, e.g. ``finished=False`` on Ray)."""
        for c in self.channels:
            c.leave(**kw)

    def hold(self, step: int) -> None:
        for c in self.channels:
            c.hold(step)


def sharded(channels: Sequence[Channel]) -> Channel:
    """The channel to one syncer itself, or a :class:`ShardedChannel` to several."""
    return channels[0] if len(channels) == 1 else ShardedChannel(channels)


def union(named: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The shards' global parameters (name -> value, each shard its own names) as one dict."""
    out: dict[str, Any] = {}
    for d in named:
        assert not set(d) & set(out), "two shards hold the same parameter"
        out.update(d)
    return out


__all__ = [
    "ShardedChannel",
    "build_shards",
    "check_syncer_shards",
    "combine_records",
    "combine_welcomes",
    "global_fragment",
    "local_fragment",
    "owned_fragments",
    "shard_name",
    "shard_of",
    "sharded",
    "union",
]
