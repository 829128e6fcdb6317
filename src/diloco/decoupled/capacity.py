"""Can this host hold the syncer? Checked before a run or a ``diloco syncer`` writes anything.

The syncer's peak memory is :func:`diloco.sim.syncer_cost.memory_bytes`: the model's FP32 state at rest (Theta,
its copy at the current version, the outer momentum and, with a lossy reply codec, the one copy learners at the
same version share) plus one merge's working set over its largest fragment, as the syncer benchmark measured
them. A run whose syncer would need more than the host has available (``MemAvailable`` in ``/proc/meminfo``;
where the host does not say, nothing is checked) is refused with the memory it needs and the fixes.

Where the syncer lives decides what is counted. On a GPU (``syncer_device``), its state is the device's: the check
is against that device's free memory. With ``syncer_shards`` S, shard s holds the fragments ``p % S == s`` and a
merge working set of its own: on this host (threads, a local Ray) every shard is counted; on a Ray cluster
(``ray_address``), which places each shard on a node of its own choosing, the largest shard must fit this host
(its nodes' memory is not known here; a GPU syncer there is not checked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from diloco.errors import ConfigError

#: Reply codecs whose merge the benchmark measured stand for the others: a lossless reply is fp32's, a lossy one
#: the most memory-hungry lossy one measured (bf16's working set).
_STAND_IN = {"fp32": "fp32", "bf16": "bf16", "fp4_e3m0": "fp4_e3m0", "fp4_e2m1": "fp4_e3m0"}


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The memory this host can give a new process without swapping (Linux ``MemAvailable``), or None."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def device_available_bytes(device: torch.device) -> int | None:
    """The memory the syncer's ``device`` can still give: a GPU's free memory, the host's for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return available_bytes()


def _cost(cfg: Any) -> Any:
    """The measured merge cost (:data:`diloco.sim.syncer_cost.SYNCER_COSTS`) standing for the config's reply codec."""
    from diloco.sim.syncer_cost import SYNCER_COSTS

    return SYNCER_COSTS[_STAND_IN.get(cfg.codec, "bf16")]


def _sizes(cfg: Any, template: nn.Module, fragments: list[list[str]] | None) -> list[int]:
    """The sizes of the fragments the config makes of ``template``."""
    from diloco.algorithm.fragments import split_fragments

    split = split_fragments(template, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=fragments)
    return [f.numel for f in split]


def syncer_bytes(cfg: Any, template: nn.Module, fragments: list[list[str]] | None) -> tuple[float, str]:
    """The syncer's peak memory for ``template``'s parameters split as the config says, and the figures' source."""
    from diloco.sim.syncer_cost import memory_bytes

    cost, sizes = _cost(cfg), _sizes(cfg, template, fragments)
    num_params = sum(p.numel() for p in template.parameters() if p.requires_grad)
    return memory_bytes(cost, num_params=num_params, fragment_values=max(sizes, default=0)), cost.source()


def shard_bytes(cfg: Any, template: nn.Module, fragments: list[list[str]] | None) -> list[float]:
    """Each of the ``syncer_shards`` shards' peak memory: its fragments' state at rest and its own merge's working
    set over its largest fragment (one shard: :func:`syncer_bytes`)."""
    from diloco.decoupled.shards import owned_fragments
    from diloco.sim.syncer_cost import memory_bytes

    cost, sizes, shards = _cost(cfg), _sizes(cfg, template, fragments), cfg.syncer_shards
    owned = [[sizes[p] for p in owned_fragments(s, shards, len(sizes))] for s in range(shards)]
    return [memory_bytes(cost, num_params=sum(n), fragment_values=max(n, default=0)) for n in owned]


def check_syncer_memory(
    cfg: Any,
    template: nn.Module,
    fragments: list[list[str]] | None,
    *,
    on_cluster: bool = False,
    available: int | None = None,
) -> None:
    """A ConfigError if the syncer would need more memory than its device has available (module docstring).

    on_cluster: the shards are Ray actors of a cluster (``ray_address``), each on a node Ray picks: the largest
    shard is checked against this host, and a GPU syncer not at all (this host's GPU, if any, is not theirs).
    available: the device's figure, where the caller knows it."""
    from diloco.decoupled.syncer_device import resolve_syncer_device

    if on_cluster and cfg.syncer_device != "cpu":
        return
    device = resolve_syncer_device(cfg.syncer_device)
    have = device_available_bytes(device) if available is None else available
    if have is None:
        return
    shards = shard_bytes(cfg, template, fragments)
    spread = on_cluster and len(shards) > 1
    need = max(shards) if spread else sum(shards)
    if need <= have:
        return
    gb = 1024**3
    num_params = sum(p.numel() for p in template.parameters() if p.requires_grad)
    what = f"its largest of {len(shards)} shards needs" if spread else "the syncer needs"
    where = f"{device}'s free memory" if device.type == "cuda" else "this host's available memory"
    fixes = [
        "run the syncer on a host with more memory (`diloco syncer` there, the learners as site jobs)",
        "shard it over a Ray cluster's hosts (syncer_shards=S with ray_address: a shard holds 1/S of the fragments)",
        "use more fragments (num_fragments: a merge's working set is one fragment's)",
        "a lossless reply (codec=fp32 holds no shared copy)",
    ]
    if device.type == "cuda":
        fixes.append("keep the syncer in host memory (syncer_device=cpu)")
    raise ConfigError(
        f"{what} about {need / gb:.1f} GiB for this model ({num_params:,} parameters in {cfg.num_fragments} "
        f"fragment(s), codec={cfg.codec}, syncer_shards={cfg.syncer_shards}) and {where} is {have / gb:.1f} GiB "
        f"(figures: {_cost(cfg).source()}). Fixes: " + "; ".join(fixes)
    )


__all__ = ["available_bytes", "check_syncer_memory", "device_available_bytes", "shard_bytes", "syncer_bytes"]
