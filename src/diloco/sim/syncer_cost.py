"""What Decoupled DiLoCo's syncer costs at a model's size: merge time per fragment, memory, shards. Torch-free.

The figures are the streaming syncer's, measured by ``benchmarks/syncer_merge.py`` on this project's 2-core CPU
(``benchmarks/results/syncer_merge.json``, the runs named in :data:`SYNCER_COSTS`; a test recomputes every
figure here from that file). A merge of one fragment of n values from M learners takes

    t(n, M) = n * (fixed_ns + per_learner_ns * M) * 1e-9 seconds,

the least-squares fit of the measured merge times (CPU seconds at one thread) over M at one size (``fixed_ns``: the reply's encode, the
outer step and the new Theta, once a merge; ``per_learner_ns``: decoding and folding one learner's report).

Memory. At rest the syncer holds, for the whole model of N values in FP32: Theta, its copy at the current
version, the outer optimizer's momentum and, with a lossy reply codec, the one copy that learners at the
same version share (:mod:`diloco.decoupled.syncer`): ``4 N (3 + lossy)`` bytes. A merge adds, for its fragment,
``transient`` x its FP32 size: the benchmark's peak growth over the fragment (the largest over M) less the
momentum and the shared copy that its first merge allocates, which are counted at rest.

Shards. S is the fewest shards that meet two bounds, and the plan names the one that sets it:

- *merge*: a merge is due ``tau`` learner steps after its reports are sent; S shards that divide each fragment's
  values among S hosts merge one in ``t(n / S, M)``, so ``t(n / S, M) <= tau * step_time`` (the fixed and
  per-learner parts both scale with n: S = ceil(t / (tau * step_time))). The syncer's shards (``syncer_shards``,
  :mod:`diloco.decoupled.shards`) own whole fragments: S of them reach the same figure with fragments S times
  smaller (P x S fragments of n / S values).
- *load*: each of the P fragments is merged once every H learner steps (staggered), and a shard merges one
  fragment at a time, so a shard holding P / S fragments must finish its P / S merges within H steps:
  ``(P / S) * t(n, M) <= H * step_time`` (S = ceil(P t / (H step_time)); every fragment charged at the largest's n).
  Splitting each fragment's values instead gives each host P merges of n / S values: the same load.

Shards own whole fragments, so S must divide P (:func:`diloco.shard_rule.check_syncer_shards`): the plan's S is the
fewest that meets both bounds *and* divides P (the bounds' 5 becomes 6 for 12 fragments), and says so; where the
bounds ask for more shards than there are fragments, it gives that rule's message (the fix: more fragments).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from diloco.errors import ConfigError
from diloco.shard_rule import check_syncer_shards

#: Where the figures come from.
BENCHMARK = "benchmarks/results/syncer_merge.json"
COMMAND = (
    "PYTHONPATH=src python benchmarks/syncer_merge.py --sizes 16M --learners 2,4,8,16 --no-grid --threads 1 "
    "--label native-16m-1t-scratch (and --codec bf16 / fp32 --label native-16m-bf16-1t-scratch / "
    "native-16m-fp32-1t-scratch)"
)
MACHINE = "this project's x86 CPU, one thread, CPU seconds; torch 2.13 CPU"


@dataclass(frozen=True)
class SyncerCost:
    """One reply codec's measured merge cost (RDA) and memory, and where they come from."""

    codec: str
    merge: str
    run: str  # the run of BENCHMARK they are fitted to (its "runs" key)
    values: int  # the fragment size measured
    learners: tuple[int, ...]  # the M measured
    fixed_ns: float  # ns per value, once a merge
    per_learner_ns: float  # ns per value per learner
    peak_growth: float  # the largest measured peak memory growth over the fragment's FP32 size
    lossy: bool

    @property
    def transient(self) -> float:
        """A merge's working set over its fragment's FP32 size (the momentum and shared copy counted at rest)."""
        return max(self.peak_growth - 1.0 - float(self.lossy), 0.0)

    def source(self) -> str:
        return (
            f"{BENCHMARK} runs[{self.run!r}] ({self.codec}, {self.merge}, {self.values:,} values, "
            f"M = {', '.join(map(str, self.learners))}; {MACHINE})"
        )


#: The streaming syncer's figures per reply codec (RDA), fitted to BENCHMARK (tests/unit/test_syncer_cost.py
#: refits them from the file and fails if they differ).
SYNCER_COSTS: dict[str, SyncerCost] = {
    c.codec: c
    for c in (
        SyncerCost("fp4_e3m0", "rda", "native-16m-1t-scratch", 13_631_488, (2, 4, 8, 16), 7.619, 1.308, 5.226, True),
        SyncerCost("bf16", "rda", "native-16m-bf16-1t-scratch", 13_631_488, (2, 4, 8, 16), 7.158, 1.294, 5.596, True),
        SyncerCost("fp32", "rda", "native-16m-fp32-1t-scratch", 13_631_488, (2, 4, 8, 16), 6.392, 0.7719, 5.027, False),
    )
}


#: The benchmark column the figures are fitted to: the merge's CPU seconds at one thread (a dedicated core's time; on
#: the shared box the wall time also holds the waits for other jobs).
TIME_KEY = "merge_cpu_s_median"


def fit_merge_times(rows: list[dict[str, Any]], *, key: str = TIME_KEY) -> tuple[float, float]:
    """(fixed_ns, per_learner_ns): least squares of ``row[key] / values * 1e9`` against M (>= 2 distinct M)."""
    xs = [float(r["learners"]) for r in rows]
    ys = [r[key] / r["values"] * 1e9 for r in rows]
    assert len(set(xs)) >= 2, "a fit over M needs two values of M"
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def merge_seconds(cost: SyncerCost, *, values: float, learners: int) -> float:
    """t(n, M): seconds to merge one fragment of ``values`` from ``learners`` reports (module docstring)."""
    return values * (cost.fixed_ns + cost.per_learner_ns * learners) * 1e-9


def shards_needed(cost: SyncerCost, *, values: float, learners: int, budget_s: float) -> int:
    """The fewest S with t(values / S, M) <= budget_s (t is linear in the values: S = ceil(t / budget))."""
    if not budget_s > 0:
        raise ConfigError(f"budget_s={budget_s}: a merge needs time; give tau >= 1 and a step time > 0")
    return max(1, math.ceil(merge_seconds(cost, values=values, learners=learners) / budget_s - 1e-12))


def memory_bytes(cost: SyncerCost, *, num_params: float, fragment_values: float) -> float:
    """The syncer's peak memory: the model's FP32 state at rest plus one merge's working set (module docstring)."""
    return 4.0 * num_params * (3.0 + float(cost.lossy)) + 4.0 * fragment_values * cost.transient


#: What sets the shard count: the merge bound, the load bound, or both alike.
SHARD_BOUNDS = ("merge", "load", "both")


@dataclass(frozen=True)
class SyncerPlan:
    """The syncer's costs for one plan (``diloco plan --method decoupled``)."""

    codec: str
    learners: int
    fragments: int
    fragment_values: float
    tau: int
    sync_every: int
    step_time_s: float
    step_time_source: str
    merge_s: float
    memory_bytes: float
    shards_for_merge: int  # the fewest S with t(n / S, M) <= tau steps
    shards_for_load: int  # the fewest S with (P / S) t(n, M) <= H steps
    sources: dict[str, str]
    state_bytes: float = 0.0  # the syncer's FP32 state at rest (memory_bytes less a merge's working set)

    @property
    def shards_for_bounds(self) -> int:
        """The fewest shards that meet both bounds, whether or not they divide the fragments."""
        return max(self.shards_for_merge, self.shards_for_load)

    @property
    def shards(self) -> int:
        """S: the fewest shards that meet both bounds and divide the P fragments (shards own whole fragments); where
        the bounds ask for more than P, their count (:attr:`shards_note` says what to change)."""
        need = self.shards_for_bounds
        return next((s for s in range(need, self.fragments + 1) if self.fragments % s == 0), need)

    @property
    def bound(self) -> str:
        """Which bound sets S (one of :data:`SHARD_BOUNDS`)."""
        if self.shards_for_merge == self.shards_for_load:
            return "both"
        return "merge" if self.shards_for_merge > self.shards_for_load else "load"

    @property
    def load_s(self) -> float:
        """Seconds of merging the P fragments take every H steps on one host (each at the largest's size)."""
        return self.fragments * self.merge_s

    @property
    def shards_note(self) -> str | None:
        """Why S is not the bounds' own count (it is the next that divides the P fragments), or the syncer's own
        message where no S <= P meets the bounds; None where the bounds' count divides P."""
        need, fragments = self.shards_for_bounds, self.fragments
        try:
            check_syncer_shards(self.shards, fragments)
        except ConfigError as exc:
            return f"the bounds need {need} shards, more than the {fragments} fragments: {exc}"
        if self.shards != need:
            return (
                f"the bounds need {need} shards; {need} does not divide the {fragments} fragments and shards own "
                f"whole fragments, so {self.shards}, the fewest that does"
            )
        return None

    @property
    def standby_copy_bytes(self) -> float:
        """What a standby syncer receives after each merge of a shard: that shard's whole state (the standby copies
        the active's newest checkpoint, diloco.decoupled.rpc.replicate), its share of :attr:`state_bytes`."""
        return self.state_bytes / self.shards

    @property
    def shard_merge_interval_s(self) -> float:
        """Seconds between two merges of one shard: it owns P / S fragments, each merged once per H steps."""
        return self.sync_every * self.step_time_s * self.shards / self.fragments

    def to_dict(self) -> dict[str, Any]:
        return {
            "codec": self.codec,
            "merge": "rda",
            "learners": self.learners,
            "fragments": self.fragments,
            "fragment_values": self.fragment_values,
            "tau": self.tau,
            "sync_every": self.sync_every,
            "step_time_s": self.step_time_s,
            "merge_s_per_fragment": self.merge_s,
            "merge_over_tau_steps": self.merge_s / (self.tau * self.step_time_s),
            "merge_s_per_outer_period": self.load_s,
            "load_over_sync_every_steps": self.load_s / (self.sync_every * self.step_time_s),
            "memory_bytes": self.memory_bytes,
            "shards_needed": self.shards,
            "shards_for_bounds": self.shards_for_bounds,
            "shards_for_merge": self.shards_for_merge,
            "shards_for_load": self.shards_for_load,
            "shards_bound": self.bound,
            "shards_note": self.shards_note,
            "standby_copy_bytes": self.standby_copy_bytes,
            "shard_merge_interval_s": self.shard_merge_interval_s,
            "sources": dict(self.sources),
        }


def plan_syncer(
    *,
    num_params: float,
    non_block_params: float,
    num_layers: int,
    fragment_layers: int,
    learners: int,
    tau: int,
    sync_every: int,
    step_time_s: float,
    step_time_source: str,
    codec: str = "fp4_e3m0",
) -> SyncerPlan:
    """The syncer of a decoupled run: fragments of ``fragment_layers`` blocks (and one of the non-block values), the
    largest of them merged from ``learners`` reports within ``tau`` steps of ``step_time_s``, and every fragment
    merged once per ``sync_every`` (H) steps."""
    if codec not in SYNCER_COSTS:
        raise ConfigError(
            f"syncer codec {codec!r}: its merge has not been measured; choose one of {', '.join(SYNCER_COSTS)}"
        )
    if tau < 1:
        raise ConfigError(
            f"tau={tau}: a decoupled syncer needs tau >= 1 steps to merge in; give --overlap with a value >= 1"
        )
    if sync_every < 1:
        raise ConfigError(f"sync_every={sync_every}: each fragment is merged once per H >= 1 steps; give --sync-every")
    if learners < 1 or num_layers < 1 or fragment_layers < 1:
        raise ConfigError(
            f"learners={learners}, layers={num_layers}, fragment layers={fragment_layers}: each must be >= 1"
        )
    cost = SYNCER_COSTS[codec]
    blocks = math.ceil(num_layers / fragment_layers)
    per_layer = (num_params - non_block_params) / num_layers
    fragment_values = max(non_block_params, min(fragment_layers, num_layers) * per_layer)
    merge_s = merge_seconds(cost, values=fragment_values, learners=learners)
    fragments = blocks + 1  # and the non-block one, as the trainer splits a model (the streaming plans' P too)
    src = cost.source()
    return SyncerPlan(
        codec=codec,
        learners=learners,
        fragments=fragments,
        fragment_values=fragment_values,
        tau=tau,
        sync_every=sync_every,
        step_time_s=step_time_s,
        step_time_source=step_time_source,
        merge_s=merge_s,
        memory_bytes=memory_bytes(cost, num_params=num_params, fragment_values=fragment_values),
        state_bytes=memory_bytes(cost, num_params=num_params, fragment_values=0.0),
        shards_for_merge=shards_needed(cost, values=fragment_values, learners=learners, budget_s=tau * step_time_s),
        shards_for_load=shards_needed(
            cost, values=fragments * fragment_values, learners=learners, budget_s=sync_every * step_time_s
        ),
        sources={
            "syncer_merge_time": (
                f"n x ({cost.fixed_ns:.3g} + {cost.per_learner_ns:.3g} x M) ns for the largest fragment (n values), "
                f"the least-squares fit over M of {src}"
            ),
            "syncer_memory": (
                f"4 N x {3 + int(cost.lossy)} bytes at rest (Theta, its copy, the outer momentum"
                + (", one copy shared by learners at a version" if cost.lossy else "")
                + f": diloco.decoupled.syncer) + {cost.transient:.3g} x the fragment's FP32 size during a merge "
                f"(peak growth {cost.peak_growth:.3g} measured: {src})"
            ),
            "syncer_shards": (
                "the fewest S that meet both bounds: merge, t(n / S, M) <= tau x the learners' step time (S shards "
                "dividing each fragment's values; syncer_shards owns whole fragments: S hosts then need fragments "
                "S times smaller); load, (P / S) x t(n, M) <= H x the step time (each fragment merged once per H "
                "steps, a shard merging one fragment at a time, every fragment charged at the largest's n); "
                "then the fewest such S that divides P (shards own whole fragments: diloco.shard_rule)"
            ),
            "learner_step_time": step_time_source,
        },
    )


__all__ = [
    "BENCHMARK",
    "SHARD_BOUNDS",
    "SYNCER_COSTS",
    "SyncerCost",
    "SyncerPlan",
    "fit_merge_times",
    "memory_bytes",
    "merge_seconds",
    "plan_syncer",
    "shards_needed",
]
