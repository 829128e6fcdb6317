"""One round's merge, streamed: each report decoded, guarded, turned into Delta_m and folded before the next.

:func:`fold_round` is the math of :meth:`diloco.decoupled.syncer.Syncer`'s merge up to the outer step: it
gives the merged outer gradient of one fragment (the sums of
:func:`~diloco.decoupled.merge.merge_outer_gradients` over the kept reports, in learner order, bit for bit,
through a :class:`~diloco.decoupled.merge.MergeFold`), the guard's verdicts, the reports that were not finite
and the token weights of the rest. It holds one fragment-sized accumulator and one Delta_m however many
learners report (``tests/unit/test_syncer_streaming.py`` keeps the stacked merge as the reference). It changes
nothing it is given but the decode buffers it makes: the guard is only read (:func:`record_verdicts` records its
verdicts once the round's outcome is known), and the passes it made are returned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from diloco.algorithm.guard import NormGuard, Verdict
from diloco.decoupled.merge import MergeFold, token_weights
from diloco.decoupled.messages import Report
from diloco.wire.codec import Codec, all_finite


def add_difference_(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, chunk: int = 1 << 18) -> bool:
    """``out += a - b`` a chunk at a time (no temporary of the full size), and whether every value of ``out`` is then
    finite (each chunk checked while it is in cache); the same values as ``out.add_(a - b)``: each is one rounded
    subtraction and one rounded addition per element."""
    finite = torch.ones((), dtype=torch.bool, device=out.device)
    for i in range(0, out.numel(), chunk):
        part = out[i : i + chunk]
        part.add_(a[i : i + chunk] - b[i : i + chunk])
        finite &= all_finite(part)
    return bool(finite)


def all_finite_chunked(x: torch.Tensor, *, chunk: int = 1 << 18) -> bool:
    """Every value of ``x`` is finite: on CPU ``all_finite`` (one pass, no temporary), elsewhere a chunk at a time
    (``all_finite`` of the whole needs a temporary its size there)."""
    if x.device.type == "cpu":
        return bool(all_finite(x))
    return all(bool(all_finite(x[i : i + chunk])) for i in range(0, x.numel(), chunk))


def judge_round(guard: NormGuard, p: int, norms: Mapping[int, float]) -> dict[int, Verdict]:
    """The guard's verdict on each report of the round that did work (steps > 0) and is finite, by its norm per
    step of work since the learner last received the fragment (``Report.steps``): ``norms``."""
    if not guard.on:
        return {}
    norms = {m: n for m, n in norms.items() if math.isfinite(n)}  # non-finite: dropped as before
    round_norms = list(norms.values())
    return {m: guard.judge(p, n, round_norms, sender=m) for m, n in norms.items()}


class Scratch:
    """The two flat FP32 buffers a syncer keeps between its merges, of its largest fragment's size on its device: a
    merge's decode buffer and its accumulator (or, under an equal-weight mean, whose accumulator is the first
    decoded outer gradient, a second decode buffer). A fresh tensor each merge would be faulted in page by page,
    about 6.5 memcpys each on Linux; these are held at rest instead."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []

    def buffers(self, numel: int, device: torch.device) -> list[torch.Tensor]:
        """Both buffers, ``numel`` values each (views; grown, never shrunk)."""
        if not self._buffers or self._buffers[0].numel() < numel or self._buffers[0].device != device:
            self._buffers = [torch.empty(numel, dtype=torch.float32, device=device) for _ in range(2)]
        return [b[:numel] for b in self._buffers]


@dataclass
class Folded:
    """What :func:`fold_round` gives: the merged outer gradient (None if no report has weight), the guard's
    verdicts, the reports that were not finite, the token weights of the kept ones (learner order) and the passes
    over the reports it made (1 in the steady state)."""

    merged: torch.Tensor | None
    verdicts: dict[int, Verdict]
    bad: set[int]
    weights: list[float]
    passes: int


def fold_round(
    p: int,
    reports: Mapping[int, Report],
    *,
    order: Sequence[int],
    theta: torch.Tensor,
    snapshot: torch.Tensor,
    bases: Mapping[int, torch.Tensor],
    codec: Codec,
    against_theta: bool,
    sizes: Sequence[int],
    embedding: Sequence[bool],
    merge: str,
    guard: NormGuard,
    scratch: Scratch | None = None,
) -> Folded:
    """The merged outer gradient of fragment ``p`` from ``reports`` (learner -> report, folded in ``order``).

    ``theta``: Theta_p; ``snapshot``: the copy of Theta_p learners received at its current version; ``bases``:
    learner -> the copy of the fragment it holds (``snapshot`` itself where it holds the current one);
    ``against_theta`` (``outer_gradient="global"``): Delta_m is formed against Theta_p, so the drift of Theta since
    a learner's copy is added to its reported difference; ``sizes`` / ``embedding`` / ``merge``: as
    :class:`~diloco.decoupled.merge.MergeFold`.

    Streaming: each report is decoded, turned into Delta_m and folded into a :class:`MergeFold` before the
    next is decoded, so a merge holds one fragment's accumulator and one Delta_m whatever the number of
    learners. The fold needs the weights, hence which reports the guard drops and which are not finite,
    before it starts: the first pass assumes that every report is accepted and finite (the steady state) and
    computes the guard's norms as it goes; if the guard then drops or clips one, or a report is not finite,
    the fold starts again from the decoded payloads with what the first pass learnt (a second decode of each
    report; a third only if clipping changed which reports are finite). The sums are those of
    :func:`~diloco.decoupled.merge.merge_outer_gradients` over the kept reports, in learner order. ``scratch``: the
    caller's buffers to decode and accumulate in (:class:`Scratch`; else fresh ones), the same values either way.
    """
    numel = theta.numel()
    verdicts: dict[int, Verdict] | None = None if guard.on else {}
    bad: set[int] = set()  # reports whose Delta_m is not finite (a prediction until a pass confirms it)
    for attempt in range(3):
        known = verdicts is not None
        vs: dict[int, Verdict] = verdicts or {}
        kept = [m for m in order if m not in bad and not (m in vs and vs[m].action == "drop")]
        weights = token_weights([reports[m].steps for m in kept], [reports[m].tokens for m in kept]) if kept else []
        free = [] if scratch is None else scratch.buffers(numel, theta.device)
        fold = (
            MergeFold(weights=weights, sizes=sizes, embedding=embedding, merge=merge, out=free.pop() if free else None)
            if any(w > 0 for w in weights)
            else None
        )
        norms: dict[int, float] = {}
        seen_bad: set[int] = set()
        buffer: torch.Tensor | None = None  # one decode buffer for the pass (a fresh one costs page faults)
        for m in order:
            verdict = vs.get(m)
            if verdict is not None and verdict.action == "drop":
                continue
            r = reports[m]
            if buffer is None:
                buffer = free.pop() if free else torch.empty(numel, dtype=torch.float32, device=theta.device)
            d = codec.decode_into(r.payload.to(buffer.device), numel, buffer)  # base_m - theta_m
            norm = math.nan  # of d as it is now, if computed: finite only if every value of d is
            if not known and r.steps > 0:
                # per step of work: a learner's first report of a fragment may cover fewer steps than H (the
                # schedule's offset), and was measured 7x smaller than the next one on the tiny preset
                norm = float(torch.linalg.vector_norm(d))
                norms[m] = norm / r.steps
            if verdict is not None and verdict.action == "clip":
                d.mul_(verdict.scale)  # clip: down to the bar, before the drift of Theta is added
                norm = math.nan
            base = bases[m]
            if base is not snapshot and against_theta:  # against Theta, not its copy
                finite = add_difference_(d, theta, base)
            else:  # a finite norm (an inf or NaN among the values makes it inf or NaN) spares a pass
                finite = math.isfinite(norm) or all_finite_chunked(d)
            if not finite:
                seen_bad.add(m)
            if finite == (m in bad):
                fold = None  # the weights of this pass counted it wrongly: its fold is void
            elif finite and fold is not None:
                fold.add(d)
            if fold is not None and fold.acc is buffer:
                buffer = None  # the fold keeps it as its accumulator (an equal-weight mean starts from it)
                if fold.out is not None:  # and leaves its own buffer unused: the next decodes go there
                    free.append(fold.out)
            del d
        if not known:
            verdicts = judge_round(guard, p, norms)
        valid = seen_bad == bad and (known or all(v.action == "accept" for v in verdicts.values()))
        bad = seen_bad
        if valid:
            merged = None if fold is None else fold.result()
            return Folded(merged=merged, verdicts=verdicts, bad=bad, weights=weights, passes=attempt + 1)
    raise AssertionError(f"the merge of fragment {p} did not settle in 3 passes")


def record_verdicts(
    guard: NormGuard, p: int, order: Sequence[int], verdicts: Mapping[int, Verdict], bad: set[int]
) -> tuple[list[int], list[int], list[float | None], list[dict]]:
    """The round's outcome in learner order, each verdict recorded with the guard as the report was judged: the
    learners kept, those dropped as not finite, the kept ones' guard ratios (None: not judged) and the guard's
    events (drops and clips, as rows)."""
    kept, dropped, ratios, events = [], [], [], []
    for m in order:
        verdict = verdicts.get(m)
        if verdict is not None and verdict.action != "accept":
            events.append(guard.record(m, p, verdict).as_row())
            if verdict.action == "drop":
                continue
        if m in bad:
            dropped.append(m)
            continue
        if verdict is not None and verdict.action == "accept":
            guard.record(m, p, verdict)
        kept.append(m)
        ratios.append(None if verdict is None else verdict.ratio)
    return kept, dropped, ratios, events


__all__ = ["Folded", "Scratch", "add_difference_", "all_finite_chunked", "fold_round", "judge_round", "record_verdicts"]
