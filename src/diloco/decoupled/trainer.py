"""What the trainer needs to run ``method='decoupled'``: a syncer from the config, a learner per replica,
and the merge log (``merges.jsonl``, one row per merge: fragment, learners, weights, waits, bytes)."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from diloco.algorithm.codecs import get_codec
from diloco.decoupled.learner import Channel, Learner
from diloco.decoupled.local import LocalTransport
from diloco.decoupled.messages import MergeRecord
from diloco.decoupled.syncer import Syncer
from diloco.files import atomic_write_bytes


def _outer(cfg: Any):
    return partial(torch.optim.SGD, lr=cfg.outer_lr, momentum=cfg.outer_momentum,
                   nesterov=cfg.outer_nesterov and cfg.outer_momentum > 0)


@contextlib.contextmanager
def decoupled_syncer(cfg: Any, template: nn.Module, fragments: list[list[str]] | None) -> Iterator[LocalTransport]:
    """The config's syncer (from the run's initial model) on a thread of its own, for the ``with`` block."""
    syncer = Syncer(template, num_learners=cfg.replicas, quorum=cfg.quorum or cfg.replicas,
                    num_fragments=cfg.num_fragments, fragment_pattern=cfg.fragment_pattern, fragments=fragments,
                    merge=cfg.merge, codec=get_codec(cfg.codec), outer_optimizer=_outer(cfg),
                    overlap_steps=cfg.overlap_steps, grace_gamma=cfg.grace_gamma, grace_ema_decay=cfg.grace_ema_decay)
    with LocalTransport(syncer, timeout=600.0) as transport:
        yield transport


def decoupled_learner(cfg: Any, model: nn.Module, channel: Channel, *, learner: int,
                      fragments: list[list[str]] | None, stats: Any) -> Learner:
    """Replica ``learner``'s side: joins the syncer (taking its parameters) and reports on the config's schedule."""
    return Learner(model, channel=channel, learner=learner, sync_every=cfg.sync_every,
                   num_fragments=cfg.num_fragments, fragment_pattern=cfg.fragment_pattern, fragments=fragments,
                   overlap_steps=cfg.overlap_steps, merge_alpha=cfg.merge_alpha, codec=get_codec(cfg.codec),
                   schedule=cfg.schedule_spec, tokens_per_step=cfg.batch_per_replica * cfg.seq_len, stats=stats)


def write_merges(path: Path, records: Sequence[MergeRecord]) -> None:
    """One JSON row per merge, in the order they happened."""
    atomic_write_bytes(Path(path), "".join(json.dumps(r.as_row()) + "\n" for r in records).encode("utf-8"))


__all__ = ["decoupled_learner", "decoupled_syncer", "write_merges"]
