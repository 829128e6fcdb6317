"""How many outer steps a run needs and the outer momentum per method: the rule measured in studies/outer-steps.

At ``cpu-1m`` on one GPU (20 tokens per parameter, global batch 64 and 128, H in {5, 10, 15, 30, 60}, outer
momentum in {0.3, 0.5, 0.9}, outer lr and inner lr bracketed, 5 seeds at each best): the best H was 10-15 inner
steps at both batches, so the best points took 80 to 240 outer steps per run, and every run with fewer than 80
lost to one with more (Streaming FP4 at batch 128: H 30, 40 outer steps, +3.83 % against data-parallel; H 15,
80 outer steps, +2.57 %). DiLoCo (outer gradients averaged, no merge) was best at outer momentum 0.5 at every H
and batch (0.9 lost 0.15-0.2 in loss); Streaming DiLoCo (merged at alpha 0.5, tau = 1) at 0.9, the papers'.

Torch-free: the trainer's config, ``diloco config`` and the planner all read it. Its numbers are pinned to the
study's summary by a test.
"""

from __future__ import annotations

from diloco.errors import ConfigError

#: Fewer outer steps than this over a run lost to more in the study (its best points took 80-240).
MIN_OUTER_STEPS = 80

#: The outer Nesterov momentum that won per method (eager updates and decoupled learners were not studied).
OUTER_MOMENTUM: dict[str, float] = {"diloco": 0.5, "streaming": 0.9}

#: Where the rule comes from.
SOURCE = "studies/outer-steps (cpu-1m, 20 tokens per parameter, batch 64 and 128, one GPU, 5 seeds at each best)"


def outer_steps(*, total_steps: int, sync_every: int) -> int:
    """Outer steps (syncs of each fragment) over a run of ``total_steps`` inner steps at H = ``sync_every``."""
    if sync_every < 1:
        raise ConfigError(f"sync_every={sync_every}: must be >= 1")
    return total_steps // sync_every


def recommended_sync_every(*, total_steps: int, num_fragments: int = 1) -> int:
    """The largest H that still gives :data:`MIN_OUTER_STEPS` outer steps (at least P = ``num_fragments``)."""
    return max(num_fragments, 1, total_steps // MIN_OUTER_STEPS)


def outer_steps_warning(
    *, method: str, total_steps: int, sync_every: int, num_fragments: int = 1, eager: bool = False
) -> str | None:
    """A warning when a synchronous DiLoCo run takes fewer outer steps than the rule, naming what gives more;
    None when it takes enough (or for data-parallel and decoupled learners, which the study did not cover)."""
    if method not in OUTER_MOMENTUM or total_steps <= 0:
        return None
    n = outer_steps(total_steps=total_steps, sync_every=sync_every)
    if n >= MIN_OUTER_STEPS:
        return None
    low = max(num_fragments, 1)
    h = recommended_sync_every(total_steps=total_steps, num_fragments=num_fragments)
    fixes = []
    if total_steps // h >= MIN_OUTER_STEPS:
        fixes.append(f"sync_every={h}" + (f" (with overlap_steps={h}: eager)" if eager else ""))
    fixes.append(f"steps >= {MIN_OUTER_STEPS * sync_every} at this H (more tokens, or a smaller global_batch)")
    if low > 1 and total_steps // low < MIN_OUTER_STEPS:
        fixes.append(f"fewer fragments (num_fragments={num_fragments} needs H >= {low})")
    return (
        f"sync_every={sync_every} gives {n} outer steps over {total_steps} inner steps; runs with fewer than "
        f"{MIN_OUTER_STEPS} lost to runs with more in {SOURCE} (Streaming at 40 outer steps +3.83 % against "
        f"data-parallel, at 80 +2.57 %). For more: {'; or '.join(fixes)}. The outer momentum that won there: "
        f"{OUTER_MOMENTUM[method]} for {method}."
    )


__all__ = [
    "MIN_OUTER_STEPS",
    "OUTER_MOMENTUM",
    "SOURCE",
    "outer_steps",
    "outer_steps_warning",
    "recommended_sync_every",
]
