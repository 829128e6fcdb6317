"""The Ray transport: the syncer as a named async actor; learners find it by name.

::

    handle = start_syncer(Syncer(model, num_learners=3, quorum=1, overlap_steps=2))   # ray.init() if needed
    # in each learner (a thread, a Ray task or actor, another process attached to the same cluster):
    channel = connect(learner=m)                       # looks the actor up by name
    algo = Learner(model, channel=channel, learner=m, sync_every=8, overlap_steps=2)
    ...
    records = ray.get(handle.records.remote())

``ray.init()`` starts a local Ray instance by default; ``address=`` joins a running cluster. Nothing here
turns Ray's token authentication off: with ``RAY_AUTH_MODE=token`` in the environment (Ray's setting),
a local instance generates its token and every call carries it.

The actor runs :class:`~diloco.decoupled.syncer.Syncer` unchanged on its event loop (one thread, so
the syncer needs no lock): a report is taken at once, a reply waits on an ``asyncio.Condition``, and a
one-shot timer merges a round when its grace window ends. Requires the optional ``ray`` extra
(``pip install -e .[ray]``); nothing in :mod:`diloco.algorithm` imports Ray.
"""

from __future__ import annotations

import asyncio
from typing import Any

import ray
import torch

from diloco.decoupled.messages import MergeRecord, Reply, Report
from diloco.decoupled.syncer import Syncer

#: The actor's default name and namespace: learners look it up by these.
DEFAULT_NAME = "diloco-syncer"
DEFAULT_NAMESPACE = "diloco"


@ray.remote
class SyncerActor:
    """A :class:`Syncer` behind Ray: join, report, wait_reply, leave (see the module docstring)."""

    def __init__(self, syncer: Syncer) -> None:
        self.syncer = syncer
        self._replies: dict[tuple[int, int], Reply] = {}
        self._cond: asyncio.Condition | None = None
        self._timer: asyncio.Task | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:  # created on the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    async def _deliver(self, replies: list[Reply]) -> None:
        if replies:
            async with self._condition():
                for r in replies:
                    self._replies[(r.learner, r.fragment)] = r
                self._condition().notify_all()
        self._arm()

    def _arm(self) -> None:
        """A one-shot timer for the earliest open grace window."""
        deadline = self.syncer.next_deadline()
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
        if deadline is not None:
            self._timer = asyncio.get_running_loop().create_task(self._tick(deadline))

    async def _tick(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - self.syncer.clock()))
        self._timer = None
        await self._deliver(self.syncer.poll())

    async def join(self, learner: int) -> list[torch.Tensor]:
        return self.syncer.join(learner)

    async def report(self, report: Report) -> None:
        await self._deliver(self.syncer.receive(report))

    async def wait_reply(self, learner: int, fragment: int) -> Reply:
        key = (learner, fragment)
        async with self._condition():
            await self._condition().wait_for(lambda: key in self._replies)
            return self._replies.pop(key)

    async def leave(self, learner: int) -> None:
        await self._deliver(self.syncer.leave(learner))

    async def records(self) -> list[MergeRecord]:
        return list(self.syncer.records)

    async def global_named_parameters(self) -> dict[str, torch.Tensor]:
        return self.syncer.global_named_parameters()

    async def state_dict(self) -> dict[str, Any]:
        return self.syncer.state_dict()


def init(*, address: str | None = None, namespace: str = DEFAULT_NAMESPACE) -> None:
    """``ray.init`` once: a local instance (``address=None``) or the cluster at ``address``."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=namespace)


def start_syncer(syncer: Syncer, *, name: str = DEFAULT_NAME, namespace: str = DEFAULT_NAMESPACE,
                 address: str | None = None) -> Any:
    """Start ``syncer`` as the named actor ``name`` (Ray started first if it is not); returns its handle."""
    init(address=address, namespace=namespace)
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        pass
    else:
        raise ValueError(f"a syncer named {name!r} already runs in namespace {namespace!r}: give another name= "
                         f"or stop it first (ray.kill(ray.get_actor({name!r}, namespace={namespace!r})))")
    return SyncerActor.options(name=name, namespace=namespace).remote(syncer)


class RayChannel:
    """One learner's :class:`diloco.decoupled.learner.Channel` to the named syncer actor."""

    def __init__(self, actor: Any, learner: int) -> None:
        self.actor, self.learner = actor, learner
        self._replies: dict[int, Any] = {}  # fragment -> the reply's ObjectRef, asked for when the report is sent

    def join(self) -> list[torch.Tensor]:
        return ray.get(self.actor.join.remote(self.learner))

    def send(self, report: Report) -> None:
        self.actor.report.remote(report)  # not waited on: the learner trains on
        self._replies[report.fragment] = self.actor.wait_reply.remote(self.learner, report.fragment)

    def wait_reply(self, fragment: int) -> Reply:
        return ray.get(self._replies.pop(fragment))

    def poll_reply(self, fragment: int) -> Reply | None:
        ready, _ = ray.wait([self._replies[fragment]], timeout=0)
        return ray.get(self._replies.pop(fragment)) if ready else None

    def leave(self) -> None:
        ray.get(self.actor.leave.remote(self.learner))


def connect(*, learner: int, name: str = DEFAULT_NAME, namespace: str = DEFAULT_NAMESPACE,
            address: str | None = None) -> RayChannel:
    """Learner ``learner``'s channel to the syncer actor ``name`` (Ray started / joined first if needed)."""
    init(address=address, namespace=namespace)
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        raise ValueError(f"no syncer named {name!r} in Ray namespace {namespace!r}: start one with "
                         f"start_syncer(syncer, name={name!r}) first, or pass the name it was started with") from None
    return RayChannel(actor, learner)


__all__ = ["DEFAULT_NAME", "DEFAULT_NAMESPACE", "RayChannel", "SyncerActor", "connect", "init", "start_syncer"]
