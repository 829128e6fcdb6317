"""Learners of several ranks: ``method='decoupled'`` under torchrun, the syncer a Ray actor.

::

    torchrun --nproc-per-node 4 -m diloco train --preset tiny --method decoupled \\
        --set replicas=2 --set ranks_per_worker=2 --set decoupled_transport=ray

M x R processes are M learners of R ranks each (consecutive global ranks, as for the other methods).
Inside a learner the R ranks train one model as a data-parallel group (each rank a share of the learner's
batch, gradients averaged over the learner's ranks every step, as a worker of the other methods does);
across learners nothing is exchanged but through the syncer, so learners keep their own clocks.

What runs where: worker 0's first rank starts the syncer as a named Ray actor (a local Ray instance, or the
cluster at ``ray_address``) and tells every process its name and Ray's address (one broadcast at the start);
each learner's first rank (its *lead*) joins that Ray instance (with the first process's token
authentication setting; each machine needs the cluster's token where Ray looks for it, ``~/.ray/auth_token``
or ``RAY_AUTH_TOKEN``) and holds the learner's
:class:`~diloco.decoupled.ray_channel.RayChannel`. The other ranks of a learner hold a
:class:`GroupChannel` without a link: whatever the lead receives from the syncer (the welcome, each reply)
is broadcast to them inside the learner, so the learner's R copies of the model stay identical. Every rank
computes its learner's reports (the same values); only the lead sends them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import uuid
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist
from torch import nn

from diloco.decoupled.learner import Channel
from diloco.decoupled.messages import Reply, Report, Welcome
from diloco.errors import ConfigError

AUTH_MODE = "RAY_AUTH_MODE"  # Ray's setting: "token" turns token authentication on


class GroupChannel:
    """One rank's :class:`~diloco.decoupled.learner.Channel` in a learner of R ranks.

    ``channel``: the link to the syncer on the learner's lead rank, None on the others. ``group``: the learner's
    process group; ``lead``: the lead's global rank. Every call is made by all of the learner's ranks at the same
    point of their (identical) loops: ``join``, ``wait_reply`` and ``poll_reply`` broadcast the lead's answer to
    the others (a collective of the learner's group); ``send`` and ``leave`` are the lead's alone."""

    def __init__(self, channel: Channel | None, *, group: Any, lead: int) -> None:
        self.channel, self.group, self.lead = channel, group, lead

    def _share(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=self.lead, group=self.group)
        return box[0]

    def join(self) -> Welcome:
        return self._share(self.channel.join() if self.channel is not None else None)

    def send(self, report: Report) -> None:
        if self.channel is not None:
            self.channel.send(report)

    def wait_reply(self, fragment: int) -> Reply:
        return self._share(self.channel.wait_reply(fragment) if self.channel is not None else None)

    def poll_reply(self, fragment: int) -> Reply | None:
        return self._share(self.channel.poll_reply(fragment) if self.channel is not None else None)

    def leave(self) -> None:
        if self.channel is not None:
            self.channel.leave()

    def hold(self, step: int) -> None:
        if self.channel is not None:
            self.channel.hold(step)


@contextlib.contextmanager
def torchrun_syncer(
    cfg: Any,
    template: nn.Module,
    fragments: list[list[str]] | None,
    *,
    worker: int,
    intra: Any = None,
    states: list[dict[str, Any]] | None = None,
) -> Iterator[Any]:
    """The running syncer for this process of a torchrun job (``method='decoupled'``; see the module docstring).

    Every process of the job enters it (one broadcast over the default group). Yields
    ``(running, final)``: a :class:`~diloco.decoupled.trainer.RunningSyncer` whose ``channel(m)`` is this
    rank's channel for learner ``m``, and a dict that, once the block has ended without an error and every
    process has reached its end (a barrier: no learner still talks to the syncer), holds on worker 0's lead
    rank the syncer's merge ``records`` and final ``global`` parameters; the actor is stopped then. ``states``
    (worker 0's lead, a resumed run): the saved state of each syncer shard, restored before the actors start
    (``syncer_shards`` > 1: one actor per shard, each learner's lead a
    :class:`~diloco.decoupled.shards.ShardedChannel` to them)."""
    from diloco.decoupled.ray_syncers import syncers_for_ray
    from diloco.decoupled.trainer import RunningSyncer

    if cfg.decoupled_transport != "ray":
        raise ConfigError(
            f"method='decoupled' under torchrun needs decoupled_transport='ray' (got "
            f"{cfg.decoupled_transport!r}: a thread of one process cannot serve learners in other "
            f"processes): --set decoupled_transport=ray"
        )
    if importlib.util.find_spec("ray") is None:
        raise ConfigError("decoupled learners under torchrun need Ray: pip install -e .[ray] (or ray>=2.9)")
    lead = intra is None or intra.rank == 0
    first = worker == 0 and lead
    shards: Any = None
    where: list[Any] = [None]
    try:
        if first:
            import ray

            from diloco.decoupled.ray_shards import RayShards

            name = f"diloco-syncer-{uuid.uuid4().hex[:12]}"
            syncers, gpus = syncers_for_ray(cfg, template, fragments, states=states)
            shards = RayShards.start(syncers, name=name, address=cfg.ray_address or None, num_gpus=gpus)
            # Ray's token authentication (on for a new local instance) is read from the environment when Ray is
            # imported: the other leads take this process's setting before they import it (the token itself they
            # read where Ray keeps it: ~/.ray/auth_token, or RAY_AUTH_TOKEN)
            where = [(name, cfg.ray_address or ray.get_runtime_context().gcs_address, os.environ.get(AUTH_MODE))]
        dist.broadcast_object_list(where, src=0)  # global rank 0 is worker 0's lead
        name, address, auth_mode = where[0]
        if lead and shards is None:
            if auth_mode is not None:
                os.environ.setdefault(AUTH_MODE, auth_mode)
            import ray

            from diloco.decoupled.ray_shards import RayShards
            from diloco.decoupled.ray_transport import DEFAULT_NAMESPACE, init

            init(address=address)
            shards = RayShards.find(name, cfg.syncer_shards, namespace=DEFAULT_NAMESPACE)

        def channel(m: int) -> Channel:
            link = shards.channel(m) if lead else None
            if intra is None or intra.world_size == 1:
                assert link is not None
                return link
            return GroupChannel(link, group=intra.group, lead=intra.global_ranks[0])

        final: dict[str, Any] = {}
        yield (
            RunningSyncer(
                channel,
                lambda: shards.records(),
                lambda: shards.global_named_parameters(),
                states=lambda: ray.get([h.state_dict.remote() for h in shards.handles]),
            ),
            final,
        )
        dist.barrier()  # every learner has flushed: nobody asks the syncer anything after this
        if first:
            final["records"] = shards.records()
            final["global"] = shards.global_named_parameters()
    finally:
        if first and shards is not None:
            shards.kill()


__all__ = ["GroupChannel", "torchrun_syncer"]
