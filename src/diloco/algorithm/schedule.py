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

Eager updates (``eager=True``, arXiv 2502.12996) overlap a whole outer step:
tau = H, so the sync started after step t finishes after step t + H, the step
at which the same fragment starts its next one. There the finish comes first
(the previous average lands), then the start; the algorithm applies both in one
outer step (:mod:`diloco.algorithm.eager`). Still at most one exchange per
fragment is in flight between steps.

Choosing the staggering (``StreamingDiLoCo(..., schedule=...)``)
------------------------------------------------------------------
The offsets are the whole choice; the three conventions in use, for fragment
p = 0..P-1 (all repeat every H steps):

=================  ============================  ==========================
convention         sends after step              merges after step
=================  ============================  ==========================
this project       ``floor((p+1) H / P)``        ``floor((p+1) H / P) + tau``
torchft 0.2.0      ``(p+1) H / P - tau``         ``(p+1) H / P``
the paper          staggered starts, one every   ``tau`` steps after sending
                   ~H/P steps (Fig. 2)
=================  ============================  ==========================

This project's default keeps P = 1 exactly plain DiLoCo at tau = 0 and lets the
last fragment send at H, 2H, ... . torchft ends each fragment's exchange where
this project starts it, so its sends come tau steps earlier; ``Schedule.torchft(H,
P, tau)`` (or ``schedule="torchft"``) reproduces it: with it, the losses and
parameters are bit-identical to ``torchft.local_sgd.DiLoCo`` run on the same
model, data and optimizers (``tests/distributed/test_torchft_equivalence.py``).
Any other timing is ``schedule=(o_0, ..., o_{P-1})``, each offset in 1..H.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from diloco.errors import ConfigError
from diloco.methods import schedule_errors

#: The named schedules ``schedule=`` takes (otherwise P comma-separated first-send steps).
ScheduleName = Literal["even", "torchft"]
SCHEDULE_NAMES: tuple[ScheduleName, ...] = get_args(ScheduleName)


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
    1..H, one per fragment); by default they are spread evenly. ``eager``: eager
    updates, tau = H (see the module docstring).
    """

    sync_every: int
    num_fragments: int = 1
    overlap_steps: int = 0
    offsets: tuple[int, ...] | None = None
    eager: bool = False
    _first: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        H, P, tau = self.sync_every, self.num_fragments, self.overlap_steps
        for name, value in (("sync_every", H), ("num_fragments", P), ("overlap_steps", tau)):
            if not isinstance(value, int) or isinstance(value, bool):
                raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
        errors = schedule_errors(H, P, tau, eager=self.eager)
        if errors:
            raise ConfigError("; ".join(errors))
        if self.offsets is None:
            first = tuple(((p + 1) * H) // P for p in range(P))
        else:
            first = tuple(int(o) for o in self.offsets)
            if len(first) != P:
                raise ConfigError(
                    f"offsets {first} has {len(first)} entries but num_fragments is {P}: "
                    f"give one first-send step per fragment"
                )
            bad = [o for o in first if not 1 <= o <= H]
            if bad:
                raise ConfigError(
                    f"offsets must lie in 1..H={H} (the inner step after which each fragment first sends), got {bad}"
                )
        object.__setattr__(self, "offsets", first)
        object.__setattr__(self, "_first", first)

    @classmethod
    def torchft(cls, sync_every: int, num_fragments: int = 1, overlap_steps: int = 0) -> Schedule:
        """torchft 0.2.0's timing: fragment p sends after ``(p+1) H/P - tau`` and merges after ``(p+1) H/P``.

        torchft requires ``H % P == 0`` and ``tau < H/P``; so does this schedule, with a message
        saying what to change.
        """
        H, P, tau = sync_every, num_fragments, overlap_steps
        if not (isinstance(H, int) and isinstance(P, int) and P >= 1 and H % P == 0):
            raise ConfigError(
                f"the torchft schedule needs sync_every (H={H}) to be a multiple of num_fragments "
                f"(P={P}), as torchft does; choose H = {P} x k"
            )
        if not (isinstance(tau, int) and 0 <= tau < H // P):
            raise ConfigError(
                f"the torchft schedule needs 0 <= overlap_steps (tau={tau}) < H/P = {H // P}: torchft "
                f"sends fragment p at (p+1) H/P - tau, which must come after the previous merge; "
                f"use tau <= {H // P - 1} or the default schedule"
            )
        return cls(H, P, tau, offsets=tuple((p + 1) * (H // P) - tau for p in range(P)))

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


def resolve_schedule(
    spec: object, sync_every: int, num_fragments: int, overlap_steps: int, *, eager: bool = False
) -> Schedule:
    """The schedule ``StreamingDiLoCo(schedule=spec)`` runs, validated against its H, P, tau and ``eager``.

    ``spec`` is ``None`` or ``"even"`` (this project's default), ``"torchft"`` (:meth:`Schedule.torchft`),
    a sequence of P offsets (each fragment's first send step, 1..H) or a :class:`Schedule`, whose
    H, P, tau and ``eager`` must equal the algorithm's.
    """
    H, P, tau = sync_every, num_fragments, overlap_steps
    if spec is None or spec == "even":
        return Schedule(H, P, tau, eager=eager)
    if spec == "torchft":
        if eager:
            raise ConfigError(
                "schedule='torchft' cannot run eager updates (torchft needs tau < H/P); use schedule='even' or offsets"
            )
        return Schedule.torchft(H, P, tau)
    if isinstance(spec, Schedule):
        mine = (spec.sync_every, spec.num_fragments, spec.overlap_steps)
        if spec.eager != eager:
            raise ConfigError(
                f"schedule has eager={spec.eager} but the algorithm was given eager={eager}; pass the same to both"
            )
        if mine != (H, P, tau):
            raise ConfigError(
                f"schedule has (H, P, tau) = {mine} but the algorithm was given sync_every={H}, "
                f"num_fragments={P}, overlap_steps={tau}; pass the same values to both, or pass "
                f"schedule=offsets (a tuple of {P} first-send steps)"
            )
        return spec
    if isinstance(spec, str):
        raise ConfigError(f"schedule={spec!r}: use 'even', 'torchft', a tuple of {P} offsets in 1..{H}, or a Schedule")
    try:
        offsets = tuple(spec)  # type: ignore[call-overload]
    except TypeError:
        raise ConfigError(
            f"schedule={spec!r}: use 'even', 'torchft', a tuple of {P} offsets in 1..{H}, or a Schedule"
        ) from None
    if not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets):
        raise ConfigError(f"schedule offsets {offsets!r} must be integers (inner steps 1..{H})")
    return Schedule(H, P, tau, offsets=offsets, eager=eager)


def config_schedule_errors(cfg: Any) -> list[str]:
    """What is wrong with a training config's ``schedule`` once its H, P and tau are valid (dp has none)."""
    if cfg.method == "dp":
        return []
    try:
        resolve_schedule(cfg.schedule_spec, cfg.sync_every, cfg.num_fragments, cfg.overlap_steps, eager=cfg.eager)
    except ValueError as exc:  # a message that already names the schedule is not prefixed with it again
        return [str(exc) if str(exc).startswith("schedule") else f"schedule={cfg.schedule!r}: {exc}"]
    return []
