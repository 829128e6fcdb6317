"""The training methods' shared terms, defined once: their names and the H/P/tau limits.

Torch-free (standard library only), so the trainer's config, the algorithm's
schedule, the simulator and the planner can all use the same definitions:

* :data:`METHODS`: ``dp`` (data-parallel), ``diloco`` (P = 1, tau = 0),
  ``streaming`` (Streaming DiLoCo) and ``decoupled`` (Decoupled DiLoCo: learners
  on their own clocks, a syncer merging whoever has reported);
* :func:`schedule_errors`: the limits on H = ``sync_every``, P =
  ``num_fragments`` and tau = ``overlap_steps`` (1 <= P <= H, 0 <= tau < H; with
  eager updates tau = H: a whole outer step overlaps the exchange).

Which fragment each block belongs to (fragment 0 holds what lies outside the
blocks) is :mod:`diloco.layout`.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from diloco.errors import ConfigError

#: The synchronous ones (one communicator, one schedule for every replica): what the simulator models.
SynchronousMethod = Literal["dp", "diloco", "streaming"]
SYNCHRONOUS_METHODS: tuple[SynchronousMethod, ...] = get_args(SynchronousMethod)

#: The methods the trainer runs.
Method = Literal[SynchronousMethod, "decoupled"]
METHODS: tuple[Method, ...] = get_args(Method)

#: How a worker's R ranks hold its model: each a full copy (gradients averaged), or a shard (FSDP2).
WorkerSharding = Literal["replicate", "fsdp"]
WORKER_SHARDING: tuple[WorkerSharding, ...] = get_args(WorkerSharding)


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`, else a ValueError naming the choices."""
    if method not in METHODS:
        raise ConfigError(f"method={method!r}: choose one of {', '.join(METHODS)}")
    return method


def schedule_errors(sync_every: int, num_fragments: int, overlap_steps: int, *, eager: bool = False) -> list[str]:
    """What is wrong with H, P, tau (empty if nothing): each message names the value and the fix.

    ``eager``: eager updates (arXiv 2502.12996), which overlap a whole outer step: tau must equal H
    (an exchange finishes as the fragment's next one starts); without them 0 <= tau < H.
    """
    H, P, tau = sync_every, num_fragments, overlap_steps
    errors = []
    if H < 1:
        errors.append(f"sync_every (H) must be >= 1, got H={H}")
        return errors
    if P < 1:
        errors.append(f"num_fragments (P) must be >= 1, got P={P}")
    elif P > H:
        errors.append(
            f"num_fragments (P={P}) cannot exceed sync_every (H={H}): each fragment needs its own "
            f"step in every window of H steps; use P <= {H} or raise H to >= {P}"
        )
    if eager:
        if tau != H:
            errors.append(
                f"eager updates overlap a whole outer step: overlap_steps (tau={tau}) must equal "
                f"sync_every (H={H}); set overlap_steps={H}"
            )
    elif tau == H:
        errors.append(
            f"overlap_steps (tau={tau}) = sync_every (H={H}) needs eager updates (eager=True); "
            f"without them use 0 <= tau <= {H - 1}"
        )
    elif not 0 <= tau < H:
        errors.append(
            f"overlap_steps (tau={tau}) must satisfy 0 <= tau < sync_every (H={H}) so that a "
            f"fragment's sync finishes before its next one starts; use 0 <= tau <= {H - 1} "
            f"(or tau = H with eager updates)"
        )
    return errors


def cooperation_errors(cfg: Any) -> list[str]:
    """What is wrong with a training config's method, H, P, tau, eager and alpha (each message names the value
    and the fix); the fragments themselves: :func:`diloco.layout.fragment_errors`."""
    errors: list[str] = []

    def need(ok: bool, msg: str) -> None:
        if not ok:
            errors.append(msg)

    need(
        not cfg.eager or cfg.method != "dp",
        "eager=true is for method=diloco or streaming (data-parallel has no outer step to overlap)",
    )
    need(cfg.overlap_steps >= 0, f"overlap_steps={cfg.overlap_steps}: must be >= 0")
    errors += schedule_errors(
        cfg.sync_every, cfg.num_fragments, cfg.overlap_steps, eager=cfg.eager and cfg.method != "dp"
    )
    if cfg.method == "diloco":
        need(
            cfg.num_fragments == 1 and (cfg.overlap_steps == 0 or cfg.eager),
            f"method='diloco' is P=1, tau=0 (or tau=H with eager) (got num_fragments={cfg.num_fragments}, "
            f"overlap_steps={cfg.overlap_steps}): use method='streaming' for fragments or overlap",
        )
    need(
        cfg.method == "decoupled" or (cfg.learner == -1 and not cfg.syncer),
        f"learner={cfg.learner}, syncer={cfg.syncer!r} are for method=decoupled site jobs: leave them unset "
        f"(learner=-1, syncer='') or set method=decoupled",
    )
    need(0.0 <= cfg.merge_alpha <= 1.0, f"merge_alpha={cfg.merge_alpha}: need 0 <= alpha <= 1")
    return errors


__all__ = [
    "METHODS",
    "SYNCHRONOUS_METHODS",
    "WORKER_SHARDING",
    "Method",
    "SynchronousMethod",
    "WorkerSharding",
    "check_method",
    "cooperation_errors",
    "schedule_errors",
]
