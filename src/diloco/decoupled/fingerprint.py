"""The handshake of a learner job with the syncer service: the config keys the merge depends on, as a
*fingerprint* both sides compute, and what differs between two fingerprints (each key named with both values).
A learner whose fingerprint differs from the syncer's is refused
(:meth:`~diloco.decoupled.membership.Membership.hello`)."""

from __future__ import annotations

from typing import Any

from diloco.decoupled.site_budget import budget_fingerprint

#: The config keys the merge depends on (a learner whose values differ from the syncer's is refused), besides
#: the data the learner loaded (``data_vocab_size`` and ``data_digest``, compared where the learner gives them):
#: the model and its initial parameters' shapes, M and the quorum, the fragments and their schedule, the wire
#: format, and the outer optimizer, merge, grace window and guard the syncer applies.
FINGERPRINT_KEYS = (
    "model",
    "size",
    "vocab_size",
    "seq_len",
    "z_loss",
    "sources",
    "tokenizer",
    "val_fraction",
    "replicas",
    "num_fragments",
    "fragment_pattern",
    "fragments",
    "schedule",
    "sync_every",
    "overlap_steps",
    "codec",
    "topk_density",
    "topk_tables",
    "merge",
    "quorum",
    "outer_scale",
    "outer_gradient",
    "outer_lr",
    "outer_momentum",
    "outer_nesterov",
    "grace_gamma",
    "grace_ema_decay",
    "guard",
    "guard_ratio",
    "late_reports",
    "syncer_shards",
)
#: Fingerprint entries of the data a process loaded: compared only when both sides give them.
DATA_KEYS = ("data_vocab_size", "data_digest")


# -- the fingerprint ---------------------------------------------------------
def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def fingerprint(cfg: Any, *, vocab_size: int | None = None, data_digest: str | None = None) -> dict[str, Any]:
    """The values of :data:`FINGERPRINT_KEYS` in ``cfg`` (a TrainConfig), plus the data's vocabulary size and
    digest (``TokenData.vocab_size`` / ``digest()``) where given. Plain JSON values."""
    out = {key: _plain(getattr(cfg, key)) for key in FINGERPRINT_KEYS}
    out.update(budget_fingerprint(cfg))  # learner_budget=tokens: every site counts the same shared budget
    out["data_vocab_size"] = None if vocab_size is None else int(vocab_size)
    out["data_digest"] = data_digest
    return out


def describe_differences(*, syncer: dict[str, Any], learner: dict[str, Any]) -> str:
    """Each key whose value differs between the two fingerprints, with both values ("" if none differs).
    A key one side lacks differs; a data key (:data:`DATA_KEYS`) is compared only when both give it."""
    keys = [k for k in FINGERPRINT_KEYS + DATA_KEYS if k in syncer or k in learner]
    keys += sorted((set(syncer) | set(learner)) - set(keys))
    missing = object()
    parts = []
    for key in keys:
        mine, theirs = learner.get(key, missing), syncer.get(key, missing)
        if key in DATA_KEYS and (mine in (None, missing) or theirs in (None, missing)):
            continue
        if mine != theirs:
            show = lambda v: "(not given)" if v is missing else repr(v)
            parts.append(f"{key}: the learner has {show(mine)}, the syncer {show(theirs)}")
    return "; ".join(parts)


__all__ = ["DATA_KEYS", "FINGERPRINT_KEYS", "describe_differences", "fingerprint"]
