"""The syncer shards a run hands to Ray (:class:`~diloco.decoupled.ray_shards.RayShards`): built here, or in their
actors.

A syncer on the CPU (``syncer_device=cpu``, the default) is built in this process and sent to its actor, as it
always was. A syncer on a GPU is built in its actor instead, by a function of the config, the template model and
the shard's saved state (a resumed run's), all on the CPU: built here, it would hold a copy of its state on this
process's GPU and travel as CUDA tensors numbered as this process sees its GPUs, which an actor that Ray shows one
GPU, as ``cuda:0``, cannot load for ``cuda:N`` with N > 0 (:func:`~diloco.decoupled.syncer_device.actor_device`).
``auto`` is built in the actor too, which asks Ray for a GPU where this process sees one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch import nn

from diloco.decoupled.syncer import Syncer
from diloco.decoupled.syncer_device import actor_device


def syncers_for_ray(
    cfg: Any, template: nn.Module, fragments: list[list[str]] | None, *, states: list[dict[str, Any]] | None = None
) -> tuple[list[Syncer | Callable[[], Syncer]], int]:
    """What :meth:`RayShards.start` takes for the config's ``syncer_shards`` (a syncer or a function that builds it,
    in shard order, each restored from ``states`` if given) and the GPUs each actor asks Ray for."""
    from diloco.decoupled.trainer import make_syncers

    if cfg.syncer_device == "cpu":
        return list(make_syncers(cfg, template, fragments, states=states)), 0
    gpus = 1 if cfg.syncer_device != "auto" or torch.cuda.is_available() else 0
    return [
        partial(build_in_actor, cfg, template, fragments, shard=s, state=None if states is None else states[s])
        for s in range(cfg.syncer_shards)
    ], gpus


def build_in_actor(
    cfg: Any, template: nn.Module, fragments: list[list[str]] | None, *, shard: int, state: dict[str, Any] | None
) -> Syncer:
    """Shard ``shard`` of the config's syncer, built in the Ray actor that runs it (on the GPU Ray gave it), restored
    from ``state`` if given."""
    from diloco.decoupled.trainer import make_syncers, restore_syncer

    cfg = dataclasses.replace(cfg, syncer_device=actor_device(cfg.syncer_device))
    syncer = make_syncers(cfg, template, fragments, only=shard)[0]
    if state is not None:
        restore_syncer(cfg, syncer, state)
    return syncer


__all__ = ["build_in_actor", "syncers_for_ray"]
