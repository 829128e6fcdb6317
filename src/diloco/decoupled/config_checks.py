"""What ``method='decoupled'`` cannot run with: the checks :class:`~diloco.train.config.TrainConfig` collects
through the method's runtime (:meth:`diloco.decoupled.runtime.DecoupledRuntime.config_errors`)."""

from __future__ import annotations

from typing import Any

from diloco.decoupled.syncer_device import syncer_device_errors
from diloco.decoupled_choices import LATE_REPORTS, check_outer_gradient, check_overwrite_after, check_transport
from diloco.errors import ConfigError


def check_late_reports(value: str) -> str:
    if value not in LATE_REPORTS:
        raise ConfigError(
            f"late_reports={value!r}: choose 'next' (it waits for the next round's quorum) or 'alone' (merged at "
            f"once, by itself)"
        )
    return value


def check_quorum(quorum: int, num_learners: int) -> None:
    if not isinstance(num_learners, int) or num_learners < 1:
        raise ConfigError(f"num_learners={num_learners!r}: give the number of learners, at least 1")
    if not isinstance(quorum, int) or not 1 <= quorum <= num_learners:
        raise ConfigError(
            f"quorum={quorum!r} with {num_learners} learners: the quorum K must lie in "
            f"1..{num_learners} (K = {num_learners} is synchronous, K = 1 never waits for a second)"
        )


def decoupled_errors(cfg: Any) -> list[str]:
    """What ``method='decoupled'`` cannot run with (each message names the value and the fix)."""
    from diloco.decoupled.grace import check_grace
    from diloco.decoupled.learner_lease import check_learner_lease
    from diloco.decoupled.merge import check_merge
    from diloco.decoupled.outer_scale import check_outer_scale

    errors = []
    checks = [
        lambda: check_quorum(cfg.quorum or cfg.replicas, cfg.replicas),
        lambda: check_merge(cfg.merge),
        lambda: check_outer_scale(cfg.outer_scale),
        lambda: check_grace(gamma=cfg.grace_gamma, decay=cfg.grace_ema_decay, overlap_steps=cfg.overlap_steps),
    ]
    if cfg.quorum < 0:
        errors.append(f"quorum={cfg.quorum}: use 0 (all learners) or 1..replicas={cfg.replicas}")
        checks = checks[1:]
    for check in checks:
        try:
            check()
        except ValueError as exc:
            errors.append(str(exc))
    if cfg.ride_out_steps < 0:
        errors.append(
            f"ride_out_steps={cfg.ride_out_steps}: give the steps to train on while a reply is late, >= 0 "
            f"(0: wait at once)"
        )
    for check, value in ((check_late_reports, cfg.late_reports), (check_learner_lease, cfg.learner_lease)):
        try:
            check(value)
        except ValueError as exc:
            errors.append(str(exc))
    for check, value in (
        (check_overwrite_after, cfg.overwrite_after),
        (check_outer_gradient, cfg.outer_gradient),
        (check_transport, cfg.decoupled_transport),
    ):
        try:
            check(value)
        except ValueError as exc:
            errors.append(str(exc))
    errors += site_errors(cfg) + syncer_device_errors(cfg) + shard_errors(cfg)
    if cfg.eager:
        errors.append(
            "method='decoupled' cannot take eager=true: eager updates stand a worker's own outer gradient in for "
            "the synchronous average while it travels, and a decoupled learner waits for no average (the syncer "
            "merges whoever reported). Set eager=false; to keep learners from waiting use overwrite_after=arrival "
            "or ride_out_steps"
        )
    if cfg.ef_decay and cfg.worker_sharding == "fsdp":
        errors.append(
            f"ef_decay={cfg.ef_decay} with worker_sharding=fsdp is not built for decoupled learners: their error-"
            f"feedback accumulators are whole fragments on every rank, which sharded checkpoints do not hold. "
            f"Set ef_decay=0 or worker_sharding=replicate"
        )
    for name, bad, fix in (
        (
            "ranks_per_worker",
            cfg.ranks_per_worker != 1 and cfg.decoupled_transport != "ray" and not cfg.syncer,
            "decoupled_transport=ray (learners of several ranks, under torchrun), a syncer= to join, or ranks_per_worker=1",
        ),
    ):
        if bad:
            errors.append(
                f"method='decoupled' does not support {name}={getattr(cfg, name)} with these settings yet: set {fix}"
            )
    return errors


def shard_errors(cfg: Any) -> list[str]:
    """``syncer_shards``: a divisor of ``num_fragments``."""
    from diloco.shard_rule import check_syncer_shards

    try:
        check_syncer_shards(cfg.syncer_shards, cfg.num_fragments)
    except ValueError as exc:
        return [str(exc)]
    return []


def site_errors(cfg: Any) -> list[str]:
    """A site job's ``learner`` and ``syncer``: both set (one learner joining a running syncer) or neither."""
    errors = []
    if cfg.learner != -1 and not 0 <= cfg.learner < cfg.replicas:
        errors.append(
            f"learner={cfg.learner}: a site job runs one learner of 0..{cfg.replicas - 1} (replicas={cfg.replicas}), "
            f"or -1 for every learner in this job"
        )
    if (cfg.learner >= 0) != bool(cfg.syncer):
        errors.append(
            f"learner={cfg.learner}, syncer={cfg.syncer!r}: a site job gives both (the learner it runs and the "
            f"NAME@ADDRESS `diloco syncer` printed); a run with its own syncer gives neither"
        )
    if cfg.syncer:
        from diloco.decoupled.service import parse_syncer

        try:
            parse_syncer(cfg.syncer)
        except ConfigError as exc:
            errors.append(str(exc))
    return errors


__all__ = ["check_late_reports", "check_quorum", "decoupled_errors", "shard_errors", "site_errors"]
