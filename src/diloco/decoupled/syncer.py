"""The syncer: the global fragments, their outer optimizers, the quorum, the grace window, the merge.

A state machine with no threads and no transport: a transport calls :meth:`Syncer.join`,
:meth:`Syncer.receive` (a learner's :class:`Report`), :meth:`Syncer.poll` (time passes) and
:meth:`Syncer.leave`, and delivers the :class:`Reply` objects they return. ``clock`` is injected, so
tests can drive time.

One merge round per fragment p. Reports of p join the open round; once ``quorum`` (K) learners have
reported (or every learner that has not left, if fewer) the grace window starts; the round merges when it
ends or when every joined learner has reported. The merge:

    Delta_m  = Theta_p - theta_m                (FP32; theta_m decoded from the learner's report)
    guard    : a report whose base_m - theta_m per step of work is an outlier is dropped or clipped (guard=)
    w_m      = token weights (c_tok * c_tok / c_steps, normalised)
    Delta    = RDA per tensor, weighted mean for embedding tensors   (merge="rda")
               or the weighted mean of every tensor                  (merge="mean")
    s        = the share of an outer step a merge of k of the M learners applies (outer_scale; by default k/M
               for the mean, sqrt(k/M) for RDA), so that the outer step per round of learner work does not
               grow with M/K; 1 when k = M
    Theta_p <- OuterOpt_p(Theta_p, s * Delta)     (refused if s * Delta is not finite: Theta_p stays)
    reply to each merged learner: the new Theta_p, encoded

A learner's report never waits for more than one round: it has at most one report per fragment in
flight (it needs the reply before it sends that fragment again).

Failures. A learner that joins again (restarted after a crash) is welcomed with the current global fragments; whatever
it had in open rounds is dropped, and its next reports count from zero steps, so it carries no weight until it has
done work. It is also given the step the others have reached (the latest step a member's report was sent after), so
that its schedule runs in phase with theirs, and the rounds already open when it joined do not wait for it: with
K = M, a learner out of phase would wait for a fragment the other has not reached while the other waits for one it
has passed. (A learner's first join starts at step 0 and open rounds wait for it, so that learners started together
stay in step however their threads or processes happen to start.) A learner whose job beats (:meth:`heartbeat`) and
falls silent past the learner lease leaves as by :meth:`leave` (:mod:`diloco.decoupled.learner_lease`). A report
carries the version of the fragment the learner held when it sent it: one that does not match what the syncer gave
that learner (a copy sent again after it was merged, e.g. a retry after a syncer restart) is ignored, so sending a
report twice is harmless. :meth:`Syncer.state_dict` holds everything but the open rounds (their learners send again), so a syncer
restored from it loses only the time it was down. Memory: besides Theta and the outer-optimizer state, the syncer
keeps the copy of each fragment each learner holds (to form Delta_m against its own Theta_p); learners that hold the
same copy (the same version, received in the same merge; with the lossless ``fp32`` codec, Theta itself) share one
tensor and one reply payload, so in the steady state of K = M there is one copy whatever M
(:mod:`diloco.decoupled.copies`). A merge streams (:func:`diloco.decoupled.fold.fold_round`): it decodes one report
at a time and folds it into running per-tensor sums, in one accumulator and one decode buffer of the largest
fragment's size, kept between merges, however many learners report, bit for bit the stacked merge.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from diloco.algorithm.fragments import Fragment, FragmentSpec, Pattern, flatten, split_fragments
from diloco.algorithm.guard import DEFAULT_GUARD_RATIO, NormGuard
from diloco.algorithm.outer import OuterOptimizerFactory, default_outer_optimizer, load_global_state
from diloco.decoupled.config_checks import check_late_reports, check_quorum
from diloco.decoupled.copies import Shared, copy_bases, is_lossless, reply_payload
from diloco.decoupled.fold import Scratch, fold_round, record_verdicts
from diloco.decoupled.grace import DEFAULT_EMA_DECAY, DEFAULT_GRACE_GAMMA, GraceWindow
from diloco.decoupled.learner_lease import LearnerLease
from diloco.decoupled.merge import check_merge
from diloco.decoupled.messages import MergeRecord, Reply, Report, Welcome
from diloco.decoupled.outer_scale import check_outer_scale, outer_step_share
from diloco.decoupled.rounds import Round, embedding_names
from diloco.decoupled.syncer_device import DEFAULT_SYNCER_DEVICE, resolve_syncer_device, to_host
from diloco.decoupled_choices import check_outer_gradient
from diloco.errors import ConfigError
from diloco.wire.codec import Codec, all_finite
from diloco.wire.registry import get_codec


class Syncer:
    """Global fragments Theta_p and their outer optimizers, merging learners' reports (module docstring).

    Args:
        model: a model of the learners' architecture; its trainable parameters are the initial Theta.
        num_learners: M, the learners that may join.
        quorum: K, learners a merge needs at least (default M: synchronous). 1 <= K <= M.
        num_fragments, fragment_pattern, fragments: as :func:`diloco.algorithm.fragments.split_fragments`
            (``fragment_pattern="balanced"``: the paper's tensor packing); learners must use the same.
        merge: ``"rda"`` (default) or ``"mean"`` (:mod:`diloco.decoupled.merge`).
        outer_gradient: ``"global"`` (default): Delta_m = Theta_p - theta_m, against the syncer's current
            Theta_p (the reading of the paper used here); ``"own"``: Delta_m = base_m - theta_m, the learner's
            own progress since the copy it started from (a stale learner then does not pull Theta back to where
            it was). The same when every learner holds the current Theta (K = M).
        outer_scale: the share of an outer step a merge of k of the M members applies
            (:mod:`diloco.decoupled.outer_scale`): ``"auto"`` (default: the measured best for ``merge``: ``"share"``
            for the mean, ``"sqrt-share"`` for RDA),
            ``"share"`` (k / M), ``"sqrt-share"`` (sqrt(k / M)) or ``"none"`` (a whole step each, the paper's
            wording; diverges at small quorums). A merge of every member is never scaled.
        codec: wire format of both directions (name or :class:`Codec`); default ``"fp32"``.
        outer_optimizer: factory ``f([tensor]) -> Optimizer`` per fragment; default Nesterov SGD 0.7 / 0.9.
        overlap_steps: tau, the learners' steps between a report and the step that needs its reply.
        grace_gamma: gamma of the grace window (0 = merge as soon as the quorum is in); default 0.2.
        grace_ema_decay: decay of the grace window's moving averages; default 0.9.
        guard: the contribution guard (:mod:`diloco.algorithm.guard`), per fragment on each learner's reported
            difference ``base_m - theta_m`` (its own progress; the drift of Theta since its copy is the syncer's
            own doing, not the learner's), by its norm per step of work (``Report.steps``): ``"drop"`` (default)
            leaves a report out of the merge whose norm per step exceeds ``guard_ratio`` x the reference (the
            round's median with 3 or more reports, else the running median of accepted ones; the learner's own
            running median where larger), ``"clip"`` scales it down to that bar, ``"off"`` accepts every finite
            report (the behaviour before the guard existed). Each event is in the merge's record (``guard``); a learner dropped 3 times in a
            row is named in a ``RuntimeWarning``.
        guard_ratio: the guard's bar on norm / reference (default 10: see the decoupled guide for why).
        late_reports: a report that comes after its slot's merge (with K < M the first K reports of a slot merge and
            the others arrive a moment later): ``"next"`` (default) opens the next round and waits for its quorum,
            about H steps when the learners run in phase (measured: a quarter of the learners' time at M = 3, K = 2
            on Ray); ``"alone"`` merges it at once, by itself (a merge of 1 of M, scaled by ``outer_scale``), so no
            learner waits a round for a partner, for about 1 % more loss at equal tokens (the decoupled guide).
        device: where the state and the merge live (:mod:`diloco.decoupled.syncer_device`): ``"cpu"`` (default),
            ``"auto"`` or a torch device; what leaves the syncer (replies, welcomes, state) is on the CPU.
        learner_lease: the failure detector's lease, seconds (0: auto): :mod:`diloco.decoupled.learner_lease`.
        clock: seconds, monotonic (default ``time.monotonic``): rounds, grace windows and the learner lease.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        num_learners: int,
        quorum: int | None = None,
        num_fragments: int = 1,
        fragment_pattern: Pattern = "strided",
        fragments: FragmentSpec | None = None,
        merge: str = "rda",
        outer_gradient: str = "global",
        outer_scale: str = "auto",
        codec: str | Codec = "fp32",
        outer_optimizer: OuterOptimizerFactory | None = None,
        overlap_steps: int = 0,
        grace_gamma: float = DEFAULT_GRACE_GAMMA,
        grace_ema_decay: float = DEFAULT_EMA_DECAY,
        guard: str = "drop",
        guard_ratio: float = DEFAULT_GUARD_RATIO,
        late_reports: str = "next",
        device: str | torch.device = DEFAULT_SYNCER_DEVICE,
        learner_lease: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        quorum = num_learners if quorum is None else quorum
        check_quorum(quorum, num_learners)
        self.num_learners, self.quorum = num_learners, quorum
        self.merge = check_merge(merge)
        self.outer_gradient = check_outer_gradient(outer_gradient)
        self.outer_scale = check_outer_scale(outer_scale)
        self.late_reports = check_late_reports(late_reports)
        self._slot: dict[int, tuple[int, frozenset[int]]] = {}  # fragment -> (last merge's step, its learners)
        self.codec = get_codec(codec)
        self.grace = GraceWindow(gamma=float(grace_gamma), overlap_steps=overlap_steps, decay=float(grace_ema_decay))
        self.guard = NormGuard(action=guard, max_ratio=float(guard_ratio), who="learner")
        self.clock = clock
        self.lease = LearnerLease(learner_lease)  # the failure detector: a silent learner leaves the quorum
        self.device = resolve_syncer_device(device)
        self.fragments: list[Fragment] = split_fragments(
            model, num_fragments, pattern=fragment_pattern, fragments=fragments
        )
        embeddings = embedding_names(model)
        self.tensor_sizes = [[p.numel() for p in f.params] for f in self.fragments]
        self.is_embedding = [[n in embeddings for n in f.names] for f in self.fragments]
        factory = outer_optimizer or default_outer_optimizer
        self.global_flat = [flatten(f.params).to(self.device).requires_grad_(True) for f in self.fragments]
        self.outer_optimizers = [factory([g]) for g in self.global_flat]
        self.versions = [0] * len(self.fragments)
        self._snapshot = [g.detach().clone() for g in self.global_flat]  # Theta at the current version
        self.members: set[int] = set()
        self._base: dict[int, list[torch.Tensor]] = {}  # learner -> the copy of each fragment it holds
        self._held: dict[int, list[int]] = {}  # learner -> the version of each fragment it holds
        self.joins: dict[int, int] = {}  # learner -> times it has joined
        self._last_sent: dict[int, int] = {}  # learner -> the step its latest report was sent after
        self.reached: dict[int, int] = {}  # learner -> the latest step it reported after (kept when it leaves)
        self._left: set[int] = set()  # learners that left (and have not joined again)
        self._rejoining: set[int] = set()  # members of a restored run, to join again as at a first join
        self._holding: dict[int, int] = {}  # learner -> the step of the checkpoint it holds at (see hold)
        self._rounds: dict[int, Round] = {}
        self.records: list[MergeRecord] = []
        self.bytes_received = 0
        self.bytes_sent = 0
        self.ignored_reports = 0  # stale or repeated reports (see the module docstring)
        self.refused_merges = 0  # merged outer gradients that were not finite: no step
        self._scratch = Scratch()  # a merge's decode buffer and accumulator, kept between merges

    # -- membership ----------------------------------------------------------
    def join(self, learner: int) -> Welcome:
        """Learner ``learner`` (0..M-1) joins, or joins again after a restart (its open reports are dropped):
        the global fragments (FP32 copies) and versions it starts from."""
        if not isinstance(learner, int) or not 0 <= learner < self.num_learners:
            raise ConfigError(f"learner={learner!r}: learners are numbered 0..{self.num_learners - 1}")
        again = learner in self.joins
        self._drop_reports(learner)
        self._rejoining.discard(learner)
        self._holding.pop(learner, None)
        self._last_sent.pop(learner, None)
        self._left.discard(learner)
        self.lease.joined(learner, self.clock())
        self.members.add(learner)
        self._base[learner] = list(self._snapshot)
        self._held[learner] = list(self.versions)
        self.joins[learner] = self.joins.get(learner, 0) + 1
        step = max(self._last_sent.values(), default=0) if again else 0
        return Welcome(
            fragments=[s.to("cpu", copy=True) for s in self._snapshot],
            versions=list(self.versions),
            incarnation=self.joins[learner] - 1,
            step=step,
        )

    def leave(self, learner: int) -> list[Reply]:
        """Learner ``learner`` stops (its unmerged reports are dropped); rounds it held up may merge now."""
        self._drop(learner)
        return self.poll()

    def heartbeat(self, learner: int) -> None:
        """Learner ``learner`` is alive (its job's heartbeat): from its first beat it is under the learner lease."""
        self.lease.beat(learner, self.clock())

    def _drop(self, learner: int) -> None:
        self.lease.left(learner)
        self.members.discard(learner)
        self._base.pop(learner, None)
        self._held.pop(learner, None)
        self._last_sent.pop(learner, None)
        self._holding.pop(learner, None)
        self._drop_reports(learner)
        self._left.add(learner)

    def hold(self, learner: int, step: int) -> list[Reply]:
        """Learner ``learner`` is at a checkpoint after its step ``step``: it has sent every report of its steps up
        to ``step`` and sends no more until every learner has saved. A round whose reports were all sent after
        steps up to ``step`` no longer waits for it (it could not report there before the others' checkpoint ends:
        with K < M a learner behind would wait for it, and it for them). With K = M no such round is open (the
        learner applied every reply of those steps first), so no merge changes."""
        self._holding[learner] = int(step)
        return self.poll()

    def _held_off(self, rnd: Round) -> set[int]:
        """The learners holding at a checkpoint that this round's reports came before (:meth:`hold`)."""
        latest = max(r.sent_after_step for r in rnd.reports.values())
        return {m for m, step in self._holding.items() if latest <= step and m not in rnd.reports}

    def _drop_reports(self, learner: int) -> None:
        """Its reports in open rounds go, and those rounds no longer wait for it (it is gone or starts afresh)."""
        for rnd in self._rounds.values():
            if rnd.reports.pop(learner, None) is not None or (learner in self.joins and learner not in self._rejoining):
                rnd.excused.add(learner)

    def expect_rejoins(self) -> None:
        """The whole run restarts from this (restored) state: every member joins again, and the rounds opened
        before one has are waited for as at a first join (:meth:`join`), so that the learners of a resumed run
        stay in step however their threads or processes happen to start."""
        self._rejoining = set(self.members)

    def expects(self, learner: int, fragment: int) -> bool:
        """Whether a report of ``fragment`` from ``learner`` waits in an open round (its reply is to come)."""
        rnd = self._rounds.get(fragment)
        return rnd is not None and learner in rnd.reports

    # -- rounds --------------------------------------------------------------
    def receive(self, report: Report) -> list[Reply]:
        """Take one learner's report; returns the replies of any merge it completes."""
        if report.learner not in self.members:
            raise ConfigError(self.lease.refusal(report.learner))
        self.lease.heard(report.learner, self.clock(), step_time=report.step_time)
        if report.base_version != self._held[report.learner][report.fragment] or self.expects(
            report.learner, report.fragment
        ):
            self.ignored_reports += 1  # merged already, or sent twice: harmless (module docstring)
            return self.poll()
        now = self.clock()
        slot = self._slot.get(report.fragment)
        if (
            self.late_reports == "alone"
            and self.quorum < self.num_learners
            and slot is not None
            and report.sent_after_step <= slot[0]
            and report.learner not in slot[1]
        ):  # it missed its slot's merge (K < M): merged at once, by itself, rather than waiting for a new quorum
            late = Round(opened_at=now, quorum_at=now)
            late.reports[report.learner] = report
            self._last_sent[report.learner] = max(self._last_sent.get(report.learner, 0), report.sent_after_step)
            self._count(report)
            self.bytes_received += report.payload.numel()
            return self._merge(report.fragment, late, now) + self.poll()
        rnd = self._rounds.setdefault(report.fragment, Round(opened_at=now))
        rnd.reports[report.learner] = report
        self._last_sent[report.learner] = max(self._last_sent.get(report.learner, 0), report.sent_after_step)
        self._count(report)
        self.bytes_received += report.payload.numel()
        if report.step_time > 0:
            self.grace.observe(step_time=report.step_time)
        return self.poll()

    def _count(self, report: Report) -> None:
        self.reached[report.learner] = max(self.reached.get(report.learner, 0), report.sent_after_step)

    @property
    def trained(self) -> int:
        """The learners' steps together, as far as their reports tell (each one's latest reported step, summed; a
        learner that left counts the steps it reported): what :class:`Reply` carries as ``trained``."""
        return sum(self.reached.values())

    def poll(self) -> list[Reply]:
        """Merge every round whose quorum is in and whose grace window has ended (or is full)."""
        now = self.clock()
        for m in self.lease.expire(now, self.members):  # silent past the learner lease: it leaves the quorum
            self._drop(m)
        replies: list[Reply] = []
        for p in sorted(self._rounds):
            rnd = self._rounds[p]
            if not rnd.reports:
                continue
            expected = set(range(self.num_learners)) - self._left - rnd.excused - self._held_off(rnd)
            if rnd.quorum_at is None and len(rnd.reports) >= min(self.quorum, max(len(expected), 1)):
                rnd.quorum_at = now
                self.grace.observe(quorum_time=now - rnd.opened_at)
                rnd.window = self.grace.seconds()
            if rnd.quorum_at is None:
                continue
            if now >= rnd.quorum_at + rnd.window or expected <= set(rnd.reports):
                del self._rounds[p]
                replies += self._merge(p, rnd, now)
        return replies

    def next_deadline(self) -> float | None:
        """When the earliest open grace window ends or the learner lease is next looked at (clock seconds), or None."""
        ends = [r.quorum_at + r.window for r in self._rounds.values() if r.reports and r.quorum_at is not None]
        return min(ends + self.lease.due(self.members, self.clock()), default=None)

    # -- the merge -----------------------------------------------------------
    @torch.no_grad()
    def _merge(self, p: int, rnd: Round, now: float) -> list[Reply]:
        start = self.clock()
        slot = max(r.sent_after_step for r in rnd.reports.values())
        previous = self._slot.get(p)
        same = previous is not None and previous[0] == slot
        self._slot[p] = (slot, (previous[1] if same else frozenset()) | frozenset(rnd.reports))
        g = self.global_flat[p]
        order = sorted(rnd.reports)  # learner order: the same sums whatever the arrival order
        folded = fold_round(
            p,
            rnd.reports,
            order=order,
            theta=g.detach(),
            snapshot=self._snapshot[p],
            bases={m: self._base[m][p] for m in order},
            codec=self.codec,
            against_theta=self.outer_gradient == "global",
            sizes=self.tensor_sizes[p],
            embedding=self.is_embedding[p],
            merge=self.merge,
            guard=self.guard,
            scratch=self._scratch,
        )
        self.extra_merge_passes += folded.passes - 1
        merged, verdicts, bad, weights = folded.merged, folded.verdicts, folded.bad, folded.weights
        del folded
        kept, dropped, ratios, events = record_verdicts(self.guard, p, order, verdicts, bad)
        assert len(kept) == len(weights)
        if merged is not None:
            g.grad = merged
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
            del merged
        self.versions[p] += 1
        self._snapshot[p] = g.detach().clone()
        replies, sent, shared = [], 0, {}
        for m in order:
            if m not in self.members:
                continue
            replies.append(self._reply(m, p, shared))
            sent += replies[-1].payload.numel()
        del shared
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

    #: Passes over a round's reports beyond the first, since this syncer started (each decodes them again).
    extra_merge_passes: int = 0

    def _reply(self, m: int, p: int, shared: Shared) -> Reply:
        """Learner ``m``'s reply of fragment ``p`` after a merge (:func:`~diloco.decoupled.copies.reply_payload`)."""
        lossless = is_lossless(self.codec)
        payload, self._base[m][p] = reply_payload(
            self.codec, self._snapshot[p], self._base[m][p], shared, lossless=lossless
        )
        self._held[m][p] = self.versions[p]
        return Reply(learner=m, fragment=p, payload=payload, version=self.versions[p], trained=self.trained)

    # -- global parameters and checkpoints -----------------------------------
    def global_named_parameters(self) -> dict[str, torch.Tensor]:
        """Name -> global value (FP32 copies) of every trainable parameter."""
        out = {}
        for f, g in zip(self.fragments, self.global_flat, strict=True):
            offset = 0
            for n, prm in zip(f.names, f.params, strict=True):
                out[n] = g.detach()[offset : offset + prm.numel()].view(prm.shape).to("cpu", copy=True)
                offset += prm.numel()
        return out

    def state_dict(self, *, records: bool = True) -> dict[str, Any]:
        """Everything but the open rounds (their learners send again): Theta, the outer optimizers, versions,
        the grace window's averages, the members with the copy and version of each fragment they hold, the
        merge records and byte counts. Plain CPU tensors and numbers (loads with ``weights_only=True``, anywhere).

        ``records=False``: only the number of merge records (``num_records``), for a caller that keeps the
        records in a log of its own (:mod:`diloco.decoupled.checkpoint`): the state then stays the same size
        however long the run."""
        state = {
            "global": [g.detach().clone() for g in self.global_flat],
            # copies: an optimizer's state_dict holds its live buffers, which later steps change in place
            "outer_optimizers": [copy.deepcopy(o.state_dict()) for o in self.outer_optimizers],
            "versions": list(self.versions),
            "grace": self.grace.state_dict(),
            "members": sorted(self.members),
            "joins": dict(self.joins),
            "last_sent": dict(self._last_sent),
            "reached": dict(self.reached),
            "left": sorted(self._left),
            "held": {m: list(v) for m, v in self._held.items()},
            # a copy only where it differs from Theta (lossy codecs, or a learner behind), one per copy held
            "bases": copy_bases(self._base, self._snapshot),
            **({"records": [r.as_row() for r in self.records]} if records else {"num_records": len(self.records)}),
            "bytes": [self.bytes_received, self.bytes_sent],
            "ignored_reports": self.ignored_reports,
            "guard": self.guard.state_dict(),
            "refused_merges": self.refused_merges,
            "learner_lease": self.lease.state_dict(self.members),
        }
        return state if self.device.type == "cpu" else to_host(state)

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any], *, records: Sequence[dict[str, Any]] | None = None) -> None:
        """Restore a :meth:`state_dict`; one written with ``records=False`` needs its ``records`` (rows)."""
        if "records" in state:
            records = state["records"]
        elif records is None or len(records) != state["num_records"]:
            raise ConfigError(
                f"this syncer state holds {state['num_records']} merge records apart from it; pass "
                f"them as records= (got {'none' if records is None else len(records)})"
            )
        load_global_state(self.global_flat, self.outer_optimizers, state, owner="syncer")
        self.versions = [int(v) for v in state["versions"]]
        self.grace.load_state_dict(state["grace"])
        self._snapshot = [g.detach().clone() for g in self.global_flat]
        self._rounds = {}
        self._rejoining, self._holding = set(), {}
        self.members = {int(m) for m in state["members"]}
        self.joins = {int(m): int(n) for m, n in state["joins"].items()}
        self._last_sent = {int(m): int(n) for m, n in state["last_sent"].items()}
        self.reached = {int(m): int(n) for m, n in state.get("reached", {}).items()}  # absent: written before it
        self._left = {int(m) for m in state["left"]}
        self._held = {int(m): [int(v) for v in vs] for m, vs in state["held"].items()}
        self._base = {int(m): bs for m, bs in copy_bases(state["bases"], self._snapshot, restore=True).items()}
        self.records = [MergeRecord.from_row(r) for r in records]
        self.bytes_received, self.bytes_sent = (int(b) for b in state["bytes"])
        self.ignored_reports = int(state["ignored_reports"])
        if "guard" in state:  # a state written before the guard existed: the guard starts afresh
            self.guard.load_state_dict(state["guard"])
        self.refused_merges = int(state.get("refused_merges", 0))  # absent in states written before it existed
        self.lease.load_state_dict(state.get("learner_lease"), self.clock())  # (None: written before it existed)

    def fragment_sizes(self) -> Sequence[int]:
        return [g.numel() for g in self.global_flat]


__all__ = ["Syncer", "embedding_names", "is_lossless"]
