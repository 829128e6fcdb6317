"""The syncer's streaming merge is bit for bit the merge it replaced, and its memory does not grow with M.

``ReferenceSyncer`` below is the syncer's merge before it streamed (every report decoded and held at once, the
merge rules over the stacked outer gradients, a copy of each fragment per learner with lossy replies), kept
verbatim as the reference. Both are driven with the same reports in the same order, over rounds with equal and
unequal token weights, a learner with no steps, an outsized report (the guard drops or clips it), a non-finite
one, K < M (learners hold different versions, so the drift of Theta enters Delta_m) and K = M, and compared with
``torch.equal`` on Theta, the outer optimizer's state, every reply payload, the copies learners hold, and the
merge records.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import nn

from diloco.decoupled.merge import MergeFold, merge_outer_gradients, token_weights
from diloco.decoupled.messages import MergeRecord, Reply, Report
from diloco.decoupled.outer_scale import outer_step_share
from diloco.decoupled.syncer import Round, Syncer, is_lossless
from diloco.wire.codec import all_finite
from diloco.wire.registry import get_codec


# -- the reference: the merge rules and the syncer's merge as they were before the streaming merge ----------
def _equal(weights: Sequence[float]) -> bool:
    return all(w == weights[0] for w in weights)


def _reference_weighted_mean(deltas: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    if _equal(weights):
        total = deltas[0].float().clone()
        for d in deltas[1:]:
            total.add_(d)
        return total.div_(len(deltas))
    total_w = sum(weights)
    out = torch.zeros_like(deltas[0], dtype=torch.float32)
    for d, w in zip(deltas, weights, strict=True):
        out.add_(d.float(), alpha=w / total_w)
    return out


def _unit(x: torch.Tensor) -> torch.Tensor:
    norm = torch.linalg.vector_norm(x)
    return x / norm if norm > 0 else torch.zeros_like(x)


def _reference_rda(deltas: Sequence[torch.Tensor], weights: Sequence[float]) -> torch.Tensor:
    total_w = sum(weights)
    radius = sum(w * float(torch.linalg.vector_norm(d.float())) for d, w in zip(deltas, weights, strict=True)) / total_w
    direction = torch.zeros_like(deltas[0], dtype=torch.float32)
    for d, w in zip(deltas, weights, strict=True):
        direction.add_(_unit(d.float()), alpha=w)
    return _unit(direction).mul_(radius)


def _reference_merge_outer_gradients(
    deltas: Sequence[torch.Tensor],
    weights: Sequence[float],
    *,
    sizes: Sequence[int],
    embedding: Sequence[bool],
    merge: str = "rda",
) -> torch.Tensor:
    kept = [(d, w) for d, w in zip(deltas, weights, strict=True) if w > 0]
    ds, ws = [d for d, _ in kept], [w for _, w in kept]
    if merge == "mean" or not any(not e for e in embedding):
        return _reference_weighted_mean(ds, ws)
    out, offset = [], 0
    for n, is_embedding in zip(sizes, embedding, strict=True):
        parts = [d[offset : offset + n] for d in ds]
        out.append(_reference_weighted_mean(parts, ws) if is_embedding else _reference_rda(parts, ws))
        offset += n
    return torch.cat(out)


class ReferenceSyncer(Syncer):
    """The syncer with its merge, guard and replies as they were before the streaming merge (verbatim)."""

    @torch.no_grad()
    def _merge(self, p: int, rnd: Round, now: float) -> list[Reply]:
        start = self.clock()
        g = self.global_flat[p]
        theta = g.detach()
        order = sorted(rnd.reports)  # learner order: the same sums whatever the arrival order
        decoded = {m: self.codec.decode(rnd.reports[m].payload, theta.numel()) for m in order}  # base_m - theta_m
        verdicts = self._judge(p, rnd, decoded)
        deltas, kept, dropped, steps, tokens, ratios, events = [], [], [], [], [], [], []
        for m in order:
            r, d, verdict = rnd.reports[m], decoded[m], verdicts.get(m)
            if verdict is not None and verdict.action != "accept":
                events.append(self.guard.record(m, p, verdict).as_row())
                if verdict.action == "drop":
                    continue
                d.mul_(verdict.scale)  # clip: down to the bar, before the drift of Theta is added
            base = self._base[m][p]
            if base is not self._snapshot[p] and self.outer_gradient == "global":  # against Theta, not its copy
                d.add_(theta - base)
            if not bool(all_finite(d)):
                dropped.append(m)
                continue
            if verdict is not None and verdict.action == "accept":
                self.guard.record(m, p, verdict)
            deltas.append(d)
            kept.append(m)
            steps.append(r.steps)
            tokens.append(r.tokens)
            ratios.append(None if verdict is None else verdict.ratio)
        weights = token_weights(steps, tokens) if kept else []
        if any(w > 0 for w in weights):
            g.grad = _reference_merge_outer_gradients(
                deltas, weights, sizes=self.tensor_sizes[p], embedding=self.is_embedding[p], merge=self.merge
            )
            # k: the learners whose work is in this merge (weight > 0), of the M the run has (members come and
            # go: at a run's end the last learner alone is a 1/M share of a round's work, not a whole one)
            share = outer_step_share(
                merged=sum(w > 0 for w in weights), members=self.num_learners, rule=self.outer_scale, merge=self.merge
            )
            if share != 1.0:  # a share of an outer step (diloco.decoupled.outer_scale); k = M is never scaled
                g.grad.mul_(share)
            if bool(all_finite(g.grad)):
                self.outer_optimizers[p].step()
            else:  # finite reports whose merge overflowed: Theta and the momentum stay as they were
                self.refused_merges += 1
                dropped, kept, weights = dropped + kept, [], []
            g.grad = None
        self.versions[p] += 1
        self._snapshot[p] = g.detach().clone()
        replies, sent = [], 0
        for m in order:
            if m not in self.members:
                continue
            replies.append(self._reply(m, p))
            sent += replies[-1].payload.numel()
        self.bytes_sent += sent
        sync_time = self.clock() - start
        self.grace.observe(sync_time=sync_time)
        assert rnd.quorum_at is not None
        self.records.append(
            MergeRecord(
                fragment=p,
                version=self.versions[p],
                learners=tuple(kept),
                weights=tuple(weights),
                dropped=tuple(dropped),
                guard=tuple(events),
                ratios=tuple(ratios),
                quorum_wait=rnd.quorum_at - rnd.opened_at,
                grace_wait=now - rnd.quorum_at,
                grace_window=rnd.window,
                sync_time=sync_time,
                bytes_received=sum(rnd.reports[m].payload.numel() for m in order),
                bytes_sent=sent,
                at=time.time(),
            )
        )
        return replies

    def _judge(self, p: int, rnd: Round, decoded: dict[int, torch.Tensor]) -> dict[int, Any]:
        """The guard's verdict on each report of the round that did work (steps > 0) and is finite, by its norm per
        step of work since the learner last received the fragment (``Report.steps``)."""
        if not self.guard.on:
            return {}
        # per step of work: a learner's first report of a fragment may cover fewer steps than H (the schedule's
        # offset), and was measured 7x smaller than the next one on the tiny preset
        norms = {
            m: float(torch.linalg.vector_norm(d)) / rnd.reports[m].steps
            for m, d in decoded.items()
            if rnd.reports[m].steps > 0
        }
        norms = {m: n for m, n in norms.items() if math.isfinite(n)}  # non-finite: dropped as before
        round_norms = list(norms.values())
        return {m: self.guard.judge(p, n, round_norms, sender=m) for m, n in norms.items()}

    def _reply(self, m: int, p: int, shared: Any = None) -> Reply:
        theta = self._snapshot[p]
        if is_lossless(self.codec):
            payload = self.codec.encode(theta)
            self._base[m][p] = theta
        else:
            base = self._base[m][p]
            payload = self.codec.encode(theta - base)
            self._base[m][p] = base + self.codec.decode(payload, theta.numel())  # what the learner will hold
        self._held[m][p] = self.versions[p]
        return Reply(learner=m, fragment=p, payload=payload, version=self.versions[p])


# -- the comparison ---------------------------------------------------------------------------------------
class Model(nn.Module):
    """An embedding (averaged under RDA), matrices and a bias; ``big``: a matrix whose FP4 payload is above the
    codecs' chunk (256K bytes), so FP4 decodes on its chunked path, into the merge's buffer."""

    def __init__(self, *, big: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 24)
        self.a = nn.Linear(24, 600 if big else 96)
        self.b = nn.Linear(600 if big else 96, 800 if big else 40, bias=False)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _syncer(cls: type[Syncer], *, M: int, K: int, codec: str, merge: str, guard: str, big: bool) -> Syncer:
    torch.manual_seed(0)
    model = Model(big=big)
    return cls(
        model,
        num_learners=M,
        quorum=K,
        num_fragments=2,
        fragments=[[model.embed, model.a], [model.b]],  # an embedding beside matrices, and matrices alone
        merge=merge,
        codec=codec,
        grace_gamma=0.0,
        guard=guard,
        clock=Clock(),
    )


def _reports(syncer: Syncer, rnd: int, p: int, learners: Sequence[int], numel: int, codec: str) -> list[Report]:
    """Round ``rnd``'s reports of fragment ``p``: equal token weights on even rounds, unequal on odd ones; a learner
    with no steps (weight 0) in round 2, an outsized report in rounds 3 and 6 (the guard drops or clips it), a
    non-finite one in round 4; the rest small random differences base - theta."""
    c = get_codec(codec)
    out = []
    for i, m in enumerate(learners):
        gen = torch.Generator().manual_seed(1000 * rnd + 10 * p + m)
        diff = torch.randn(numel, generator=gen).mul_(1e-2 * (1 + 0.3 * m))
        if rnd in (3, 6) and i == 0:
            diff.mul_(1e4)
        if rnd == 4 and i == len(learners) - 1:
            diff[numel // 2] = math.nan
        steps = 0 if rnd == 2 and i == 1 else 8 if rnd % 2 == 0 else 4 + m
        tokens = 64.0 * steps if rnd % 2 == 0 else 50.0 * steps + 7 * m
        out.append(
            Report(
                learner=m,
                fragment=p,
                payload=c.encode(diff),
                steps=steps,
                tokens=tokens,
                step_time=0.0,
                sent_after_step=10 * (rnd + 1),
                base_version=syncer._held[m][p],
            )
        )
    return out


def _record_row(r: MergeRecord) -> dict:
    row = r.as_row()
    for timing in ("sync_time", "at", "quorum_wait", "grace_wait", "grace_window"):
        row.pop(timing, None)
    return row


def _assert_same(new: Syncer, ref: Syncer) -> None:
    for a, b in zip(new.global_flat, ref.global_flat, strict=True):
        assert torch.equal(a, b)
    for oa, ob in zip(new.outer_optimizers, ref.outer_optimizers, strict=True):
        for sa, sb in zip(oa.state.values(), ob.state.values(), strict=True):
            for key in sa:
                assert torch.equal(sa[key], sb[key]), key
    assert new.versions == ref.versions and new._held == ref._held
    for m in ref._base:
        for a, b in zip(new._base[m], ref._base[m], strict=True):
            assert torch.equal(a, b)
            assert a.untyped_storage().data_ptr() != 0
    assert [_record_row(r) for r in new.records] == [_record_row(r) for r in ref.records]
    assert new.guard.state_dict() == ref.guard.state_dict()


def _drive(*, M: int, K: int, codec: str, merge: str, guard: str, big: bool = False, rounds: int = 7) -> Syncer:
    new = _syncer(Syncer, M=M, K=K, codec=codec, merge=merge, guard=guard, big=big)
    ref = _syncer(ReferenceSyncer, M=M, K=K, codec=codec, merge=merge, guard=guard, big=big)
    for m in range(M):
        new.join(m)
        ref.join(m)
    sizes = new.fragment_sizes()
    merges = 0
    for rnd in range(rounds):
        for p in range(len(sizes)):
            # K < M: a rotating set of K learners, so learners hold different versions and Theta drifts from them
            learners = sorted((rnd * K + p + j) % M for j in range(K))
            for rep_new, rep_ref in zip(
                _reports(new, rnd, p, learners, sizes[p], codec),
                _reports(ref, rnd, p, learners, sizes[p], codec),
                strict=True,
            ):
                out_new, out_ref = new.receive(rep_new), ref.receive(rep_ref)
                assert len(out_new) == len(out_ref)
                for a, b in zip(out_new, out_ref, strict=True):
                    assert (a.learner, a.fragment, a.version) == (b.learner, b.fragment, b.version)
                    assert torch.equal(a.payload, b.payload)
                merges += len(out_new) > 0
            _assert_same(new, ref)
    assert merges == rounds * len(sizes), "every round merges"
    events = [e["action"] for r in ref.records for e in r.guard]
    assert (not events) == (guard == "off") and all(a == guard for a in events), events
    assert any(r.dropped for r in ref.records), "a non-finite report was dropped"
    return new


@pytest.mark.parametrize("codec", ["fp32", "fp4_e3m0", "bf16"])
@pytest.mark.parametrize("merge", ["mean", "rda"])
@pytest.mark.parametrize("M, K", [(2, 1), (2, 2), (4, 2), (4, 4), (8, 3), (8, 8)])
def test_streaming_merge_is_bit_identical_to_the_stacked_merge(codec, merge, M, K):
    _drive(M=M, K=K, codec=codec, merge=merge, guard="drop" if (M + K) % 2 else "clip")


@pytest.mark.parametrize("merge", ["mean", "rda"])
def test_streaming_merge_is_bit_identical_above_the_codecs_chunk_and_with_the_guard_off(merge):
    _drive(M=4, K=3, codec="fp4_e3m0", merge=merge, guard="drop", big=True, rounds=5)
    _drive(M=3, K=3, codec="fp4_e3m0", merge=merge, guard="off", rounds=5)


def _steady(*, M: int, codec: str, rounds: int = 3) -> Syncer:
    """K = M rounds with nothing for the guard to act on."""
    syncer = _syncer(Syncer, M=M, K=M, codec=codec, merge="rda", guard="drop", big=False)
    for m in range(M):
        syncer.join(m)
    sizes = syncer.fragment_sizes()
    for rnd in (0, 1, 2, 5)[:rounds]:  # rounds without an outsized, non-finite or weightless report
        for p in range(len(sizes)):
            for rep in _reports(syncer, rnd, p, range(M), sizes[p], codec):
                syncer.receive(rep)
    return syncer


@pytest.mark.parametrize("codec", ["fp32", "fp4_e3m0"])
def test_learners_that_hold_the_same_version_share_one_copy_and_one_reply_payload(codec):
    M = 8
    syncer = _steady(M=M, codec=codec)
    for p in range(2):
        copies = {id(syncer._base[m][p]) for m in range(M)}
        assert len(copies) == 1, f"{len(copies)} copies of fragment {p} for {M} learners at one version"
        assert (syncer._base[0][p] is syncer._snapshot[p]) == (codec == "fp32")
    assert syncer.extra_merge_passes == 0, "each report decoded once when the guard accepts all of them"
    # a checkpoint keeps one copy, and so does the syncer restored from it
    state = syncer.state_dict()
    restored = _syncer(Syncer, M=M, K=M, codec=codec, merge="rda", guard="drop", big=False)
    restored.load_state_dict(state)
    for p in range(2):
        assert len({id(restored._base[m][p]) for m in range(M)}) == 1
        assert torch.equal(restored._base[M - 1][p], syncer._base[M - 1][p])


def test_a_report_the_guard_acts_on_costs_a_second_pass():
    syncer = _steady(M=4, codec="fp4_e3m0", rounds=2)
    assert syncer.extra_merge_passes == 0
    for rep in _reports(syncer, 3, 0, range(4), syncer.fragment_sizes()[0], "fp4_e3m0"):  # learner 0 outsized
        syncer.receive(rep)
    assert [e["action"] for e in syncer.records[-1].guard] == ["drop"]
    assert syncer.extra_merge_passes == 1


def test_merge_fold_equals_merge_outer_gradients_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    sizes, embedding = [300, 7, 1000, 64], [True, False, False, True]
    deltas = [torch.randn(sum(sizes), generator=gen) for _ in range(5)]
    deltas[2][300:307] = 0.0  # a tensor with no change: unit(0) = 0
    for merge in ("rda", "mean"):
        for weights in (
            [0.2] * 5,
            [0.1, 0.0, 0.3, 0.4, 0.2],
            token_weights([3, 4, 0, 5, 5], [9.0, 8.0, 0.0, 10.0, 20.0]),
        ):
            fold = MergeFold(weights=weights, sizes=sizes, embedding=embedding, merge=merge)
            for d in deltas:
                fold.add(d.clone())
            expected = _reference_merge_outer_gradients(deltas, weights, sizes=sizes, embedding=embedding, merge=merge)
            assert torch.equal(fold.result(), expected), (merge, weights)
            assert torch.equal(
                expected,
                merge_outer_gradients(deltas, weights, sizes=sizes, embedding=embedding, merge=merge),
            )


@pytest.mark.parametrize("codec", ["stat2", "topk", "int8"])
def test_streaming_merge_is_bit_identical_with_the_other_codecs(codec):
    _drive(M=4, K=2, codec=codec, merge="rda", guard="drop")


@pytest.mark.parametrize("merge", ["mean", "rda"])
def test_a_merge_decodes_and_accumulates_in_buffers_kept_between_merges(merge):
    """Two buffers of the largest fragment's size, made at the first merge and used by every later one (a fresh
    tensor a merge costs its page faults); the merges stay the stacked merge's (the tests above, same syncer)."""
    syncer = _syncer(Syncer, M=2, K=2, codec="fp4_e3m0", merge=merge, guard="drop", big=False)
    for m in range(2):
        syncer.join(m)
    sizes = syncer.fragment_sizes()
    for rnd in (0, 1):  # equal token weights, then unequal ones
        for p in range(len(sizes)):
            for rep in _reports(syncer, rnd, p, [0, 1], sizes[p], "fp4_e3m0"):
                syncer.receive(rep)
        if rnd == 0:
            kept = [b.data_ptr() for b in syncer._scratch._buffers]
    assert [b.numel() for b in syncer._scratch._buffers] == [max(sizes)] * 2
    assert [b.data_ptr() for b in syncer._scratch._buffers] == kept
