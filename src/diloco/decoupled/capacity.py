"""Can this host hold the syncer? Checked before a run or a ``diloco syncer`` writes anything.

The syncer's peak memory is :func:`diloco.sim.syncer_cost.memory_bytes`: the model's FP32 state at rest (Theta,
its copy at the current version, the outer momentum and, with a lossy reply codec, the one copy learners at the
same version share) plus one merge's working set over its largest fragment, as the syncer benchmark measured
them. A run whose syncer would need more than the host has available (``MemAvailable`` in ``/proc/meminfo``;
where the host does not say, nothing is checked) is refused with the memory it needs and the fixes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def syncer_bytes(cfg: Any, template: nn.Module, fragments: list[list[str]] | None) -> tuple[float, str]:
    """The syncer's peak memory for ``template``'s parameters split as the config says, and the figures' source."""
    from diloco.algorithm.fragments import split_fragments
    from diloco.sim.syncer_cost import SYNCER_COSTS, memory_bytes

    cost = SYNCER_COSTS[_STAND_IN.get(cfg.codec, "bf16")]
    split = split_fragments(template, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=fragments)
    num_params = sum(p.numel() for p in template.parameters() if p.requires_grad)
    largest = max((f.numel for f in split), default=0)
    return memory_bytes(cost, num_params=num_params, fragment_values=largest), cost.source()


def check_syncer_memory(
    cfg: Any, template: nn.Module, fragments: list[list[str]] | None, *, available: int | None = None
) -> None:
    """A ConfigError if the syncer would need more memory than this host has available (module docstring)."""
    have = available_bytes() if available is None else available
    if have is None:
        return
    need, source = syncer_bytes(cfg, template, fragments)
    if need <= have:
        return
    gb = 1024**3
    num_params = sum(p.numel() for p in template.parameters() if p.requires_grad)
    raise ConfigError(
        f"the syncer needs about {need / gb:.1f} GiB for this model ({num_params:,} parameters in "
        f"{cfg.num_fragments} fragment(s), codec={cfg.codec}) and this host has {have / gb:.1f} GiB available "
        f"(figures: {source}). Run the syncer on a host with more memory (`diloco syncer` there, the learners as "
        f"site jobs), use more fragments (num_fragments: a merge's working set is one fragment's), or a lossless "
        f"reply (codec=fp32 holds no shared copy); a syncer sharded over hosts is not built yet"
    )


__all__ = ["available_bytes", "check_syncer_memory", "syncer_bytes"]
