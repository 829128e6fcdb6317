"""A sharded syncer on Ray: S syncer actors (:mod:`diloco.decoupled.shards`) started, found, read and stopped as one.

Shard s is the actor ``NAME-shard<s>`` (S = 1: ``NAME``, the syncer's one actor, as before), each a
:class:`~diloco.decoupled.ray_transport.SyncerActor` with its own checkpoints (``DIR/shard-<s>``; S = 1: ``DIR``)
and its own restarts, which Ray may place on any node. A learner holds one
:class:`~diloco.decoupled.ray_channel.RayChannel` per shard behind a
:class:`~diloco.decoupled.shards.ShardedChannel`; with a fingerprint (a site job) it claims its index at each
shard and beats for it at each."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray

from diloco.decoupled.learner import Channel
from diloco.decoupled.learner_lease import combine_summaries
from diloco.decoupled.messages import MergeRecord
from diloco.decoupled.ray_channel import RayChannel, connect
from diloco.decoupled.ray_transport import DEFAULT_NAMESPACE, start_syncer
from diloco.decoupled.shards import combine_records, shard_name, sharded, union
from diloco.errors import ConfigError


def shard_checkpoint_dir(root: Path | str | None, shard: int, num_shards: int) -> str | None:
    """Shard ``shard``'s checkpoint folder under ``root`` (``root`` itself when there is one shard)."""
    if root is None:
        return None
    return str(root) if num_shards == 1 else str(Path(root) / f"shard-{shard}")


class RayShards:
    """The actors of a syncer's S shards (``handles``, in shard order), as one."""

    def __init__(self, handles: Sequence[Any], *, name: str) -> None:
        self.handles, self.name = list(handles), name

    @property
    def num_shards(self) -> int:
        return len(self.handles)

    @classmethod
    def start(
        cls,
        syncers: Sequence[Any],
        *,
        name: str,
        namespace: str = DEFAULT_NAMESPACE,
        address: str | None = None,
        checkpoint_dir: Path | str | None = None,
        keep: int = 2,
        detached: bool = False,
        fingerprint: dict[str, Any] | None = None,
        num_gpus: float | None = None,
    ) -> RayShards:
        """:func:`~diloco.decoupled.ray_transport.start_syncer` for each shard's syncer (or the function that builds
        it), in shard order (``num_gpus``: Ray's GPUs for each shard's actor, as there); if one fails, those started
        are stopped."""
        S, handles = len(syncers), []
        try:
            for s, syncer in enumerate(syncers):
                handles.append(
                    start_syncer(
                        syncer,
                        name=shard_name(name, s, S),
                        namespace=namespace,
                        address=address,
                        checkpoint_dir=shard_checkpoint_dir(checkpoint_dir, s, S),
                        keep=keep,
                        detached=detached,
                        fingerprint=fingerprint,
                        num_gpus=num_gpus,
                    )
                )
        except BaseException:
            for h in handles:
                ray.kill(h, no_restart=True)
            raise
        return cls(handles, name=name)

    @classmethod
    def find(cls, name: str, num_shards: int, *, namespace: str = DEFAULT_NAMESPACE) -> RayShards:
        """The running shards of the syncer ``name`` (``ValueError`` if one is not found)."""
        S = num_shards
        return cls([ray.get_actor(shard_name(name, s, S), namespace=namespace) for s in range(S)], name=name)

    def channel(self, learner: int) -> Channel:
        """Learner ``learner``'s channel to every shard (no claim: the learners of one job's threads)."""
        return sharded([RayChannel(h, learner) for h in self.handles])

    def records(self) -> list[MergeRecord]:
        return combine_records(ray.get([h.records.remote() for h in self.handles]))

    def global_named_parameters(self) -> dict[str, Any]:
        return union(ray.get([h.global_named_parameters.remote() for h in self.handles]))

    def learner_steps(self) -> dict[int, int]:
        """Each learner's latest reported step at any shard (the steps the syncer counts as trained for it)."""
        steps: dict[int, int] = {}
        for each in ray.get([h.learner_steps.remote() for h in self.handles]):
            for m, n in each.items():
                steps[int(m)] = max(steps.get(int(m), 0), int(n))
        return steps

    def pids(self) -> list[int]:
        return ray.get([h.pid.remote() for h in self.handles])

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The shards' :meth:`~diloco.decoupled.membership.Membership.status` as one syncer's: merges summed, the
        members any shard has, the learners live and finished at every shard; ``pid`` and ``restored_merges``
        are the one shard's (S = 1) or a list, shard by shard."""
        each = ray.get([h.status.remote() for h in self.handles], timeout=timeout)
        if len(each) == 1:
            return each[0]
        restored = [s["restored_merges"] for s in each]
        return {
            "num_learners": each[0]["num_learners"],
            "merges": sum(s["merges"] for s in each),
            "members": sorted(set().union(*(s["members"] for s in each))),
            "live": sorted(set.intersection(*(set(s["live"]) for s in each))),
            "finished": sorted(set.intersection(*(set(s["finished"]) for s in each))),
            "pid": [s["pid"] for s in each],
            "restored_merges": None if all(r is None for r in restored) else restored,
        }

    def lease_summary(self) -> dict[str, Any]:
        """The learner lease's summary (:func:`~diloco.decoupled.learner_lease.combine_summaries` of the shards')."""
        return combine_summaries(ray.get([h.learner_lease.remote() for h in self.handles]))

    def kill(self, *, no_restart: bool = True) -> None:
        for h in self.handles:
            ray.kill(h, no_restart=no_restart)


def connect_shards(
    *,
    learner: int,
    name: str,
    num_shards: int,
    namespace: str = DEFAULT_NAMESPACE,
    address: str | None = None,
    fingerprint: dict[str, Any] | None = None,
) -> Channel:
    """Learner ``learner``'s channel to the ``num_shards`` shards of the syncer ``name``
    (:func:`~diloco.decoupled.ray_channel.connect` to each: with ``fingerprint``, its index claimed and held at
    each); a shard not found is a ConfigError naming it."""
    channels = []
    try:
        for s in range(num_shards):
            name_s = shard_name(name, s, num_shards)
            channels.append(
                connect(learner=learner, name=name_s, namespace=namespace, address=address, fingerprint=fingerprint)
            )
    except ConfigError as exc:
        for c in channels:  # the claims made at the shards found
            c.leave(finished=False) if c.session is not None else None
        if str(exc).startswith("no syncer named"):
            raise ConfigError(
                f"{exc} (this learner has syncer_shards={num_shards}: its shards are named "
                f"{shard_name(name, 0, num_shards)!r} ...; give the syncer's syncer_shards)"
            ) from None
        raise
    return sharded(channels)


__all__ = ["RayShards", "connect_shards", "shard_checkpoint_dir"]
