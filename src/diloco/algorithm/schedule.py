"""Who syncs when: the single source of truth for the Streaming DiLoCo schedule.

The trainer, the byte accounting and the compute-utilization simulator all ask
this module, so the simulator models exactly the schedule the trainer runs.

Conventions
-----------
Inner steps are numbered t = 1, 2, 3, ...; "after step t" means after the t-th
inner optimizer step has been applied.

* Fragment p *starts* a sync after step t when ``t >= first_p`` and
  ``(t - first_p) % H == 0``: its outer gradient is computed, encoded and sent.
* It *finishes* that sync after step ``t + tau``: the exchange is waited on,
  averaged, the outer optimizer steps the global copy and local parameters are
  merged. With ``tau = 0`` start and finish happen after the same step
  (start first).

``first_p`` (the fragment's *offset*, 1 <= first_p <= H) defaults to
``round_down((p + 1) * H / P)``: the P syncs are spread evenly over every
window of H steps (one every ~H/P steps) and the last fragment syncs after
step H, 2H, ... so that P = 1 is exactly plain DiLoCo (sync after every H
steps). In the steady state every fragment syncs exactly once per H steps;
its first window is shorter (first_p steps), as in the paper, where fragments
start staggered.

Since tau < H, a fragment's sync always finishes before its next one starts,
so at most one exchange per fragment is in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diloco.methods import schedule_errors


@dataclass(frozen=True)
class SyncEvents:
    """What happens after one inner step: fragments starting and finishing a sync."""

    step: int
    starts: tuple[int, ...]
    finishes: tuple[int, ...]


@dataclass(frozen=True)
class Schedule:
    """Sync schedule for H = ``sync_every``, P = ``num_fragments``, tau = ``overlap_steps``.

    ``offsets`` optionally overrides each fragment's first sync step (values in
    1..H, one per fragment); by default they are spread evenly.
    """

    sync_every: int
    num_fragments: int = 1
    overlap_steps: int = 0
    offsets: tuple[int, ...] | None = None
    _first: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        H, P, tau = self.sync_every, self.num_fragments, self.overlap_steps
        for name, value in (("sync_every", H), ("num_fragments", P), ("overlap_steps", tau)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        errors = schedule_errors(H, P, tau)
        if errors:
            raise ValueError("; ".join(errors))
        if self.offsets is None:
            first = tuple(((p + 1) * H) // P for p in range(P))
        else:
            first = tuple(int(o) for o in self.offsets)
            if len(first) != P:
                raise ValueError(f"offsets has {len(first)} entries but num_fragments is {P}")
            bad = [o for o in first if not 1 <= o <= H]
            if bad:
                raise ValueError(f"offsets must lie in 1..H={H}, got {bad}")
        object.__setattr__(self, "offsets", first)
        object.__setattr__(self, "_first", first)

    # -- queries -------------------------------------------------------------
    def starts(self, step: int) -> tuple[int, ...]:
        """Fragments that start a sync (send their outer gradient) after inner step ``step``."""
        H = self.sync_every
        return tuple(p for p, f in enumerate(self._first) if step >= f and (step - f) % H == 0)

    def finishes(self, step: int) -> tuple[int, ...]:
        """Fragments that finish a sync (outer step + merge) after inner step ``step``."""
        return self.starts(step - self.overlap_steps)

    def events(self, step: int) -> SyncEvents:
        return SyncEvents(step, self.starts(step), self.finishes(step))

    def pending_after(self, step: int) -> tuple[int, ...]:
        """Fragments whose sync was started but not yet finished after ``step``."""
        tau = self.overlap_steps
        return tuple(sorted({p for s in range(step - tau + 1, step + 1) for p in self.starts(s)}))
