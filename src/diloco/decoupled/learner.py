"""A learner: one model training on its own clock, reporting fragments to the syncer.

Wraps a model like :class:`diloco.StreamingDiLoCo` and offers the same loop hooks
(:class:`diloco.algorithm.base.ReplicaAlgorithm`)::

    learner = Learner(model, channel=channel, sync_every=H, num_fragments=P, overlap_steps=tau)
    for x, y in batches:
        loss.backward(); inner.step(); inner.zero_grad()
        learner.after_optimizer_step(tokens=x.numel())
    learner.close()                     # finishes what is in flight, then leaves

The schedule (:class:`diloco.algorithm.schedule.Schedule`) says, on the learner's own step count, when
fragment p is due. After step t, for every fragment the schedule starts, the learner sends a
:class:`~diloco.decoupled.messages.Report`: ``encode(base_p - theta_p)`` (its values, as the difference
from the global copy it last received) and its counters for p (steps, tokens since it last received p).

After step t + tau it needs the syncer's reply: it waits for it there only if it has not arrived, then
overwrites the fragment (``merge_alpha`` alpha = 0, the default: the global values as they are; alpha > 0:
``alpha * local + (1 - alpha) * global``) and resets p's counters. The grace window is sized so that the
reply normally arrives within those tau steps; with quorum K = M the learner waits for the slowest.

``overwrite_after="arrival"`` takes the other reading of "tau steps later": the learner never waits at
t + tau; it checks after every step whether the reply has arrived and overwrites tau steps after the
step at which it saw it. It waits only when the fragment is due again with its reply not yet applied
(so still at most one report per fragment in flight). Timing then depends on the machines' speeds,
so runs are not reproducible bit for bit; the default (``"send"``) is the Streaming DiLoCo timing.

A learner has at most one report per fragment in flight (tau < H). Learners never talk to each other.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn

from diloco.algorithm.base import ReplicaAlgorithm, SyncReport, local_shards
from diloco.algorithm.fragments import Fragment, FragmentSpec, Pattern, flatten, split_fragments
from diloco.algorithm.outer import merge_
from diloco.algorithm.schedule import Schedule, resolve_schedule
from diloco.comm.accounting import CommStats
from diloco.decoupled.messages import Reply, Report, Welcome
from diloco.decoupled.syncer import is_lossless
from diloco.decoupled_choices import check_overwrite_after
from diloco.errors import ConfigError
from diloco.train.sharding import is_sharded, shard_like
from diloco.wire.codec import Codec
from diloco.wire.error_feedback import ErrorFeedback
from diloco.wire.registry import get_codec


class Channel(Protocol):
    """A learner's link to the syncer (any transport)."""

    def join(self) -> Welcome:
        """Join (or join again after a restart); the global fragments (FP32) and versions to start from."""

    def send(self, report: Report) -> None:
        """Send a report (does not wait)."""

    def wait_reply(self, fragment: int) -> Reply:
        """The reply to this learner's report of ``fragment`` (waits until it arrives)."""

    def poll_reply(self, fragment: int) -> Reply | None:
        """That reply if it has arrived, else None (does not wait)."""

    def leave(self) -> None:
        """Stop: the syncer no longer counts this learner."""

    def hold(self, step: int) -> None:
        """At a checkpoint after ``step``, every report up to it sent (and received by the syncer when this
        returns): rounds of those steps do not wait for this learner (:meth:`~diloco.decoupled.syncer.Syncer.hold`)."""


class Learner(ReplicaAlgorithm):
    """One learner of Decoupled DiLoCo (module docstring).

    Args:
        model: this learner's model; its trainable parameters are overwritten with the syncer's on joining.
        channel: the link to the syncer (:class:`Channel`).
        learner: this learner's number, 0..M-1.
        sync_every: H, the learner's steps between two reports of one fragment.
        num_fragments, fragment_pattern, fragments: as the syncer's (the same split on both sides).
        overlap_steps: tau, steps between a report and the overwrite with its reply (0 <= tau < H).
        merge_alpha: alpha, weight of the local values in the overwrite (0, the default: overwrite).
        codec: wire format, as the syncer's.
        schedule: when each fragment is due (as :class:`diloco.StreamingDiLoCo`'s ``schedule``).
        tokens_per_step: tokens counted for a step when :meth:`after_optimizer_step` is given none.
        stats: a :class:`diloco.comm.accounting.CommStats` to count this learner's bytes in (optional).
        overwrite_after: ``"send"`` (default): overwrite after step t + tau, t the step the report was sent
            after, waiting there if the reply is late; ``"arrival"``: tau steps after the step at which the
            reply was seen to have arrived (see the module docstring).
        ride_out_steps: B (with ``"send"``): a reply not there at t + tau does not stop the learner: it trains
            on, looks for the reply after every step and overwrites when it comes, skipping that fragment's
            reports meanwhile, for up to B steps past t + tau; only then does it wait (counted in
            ``ride_out_waits``). For a syncer that is down or slow (a restart takes seconds); 0 (default): wait
            at t + tau, the Streaming DiLoCo timing (runs are reproducible only then).
        error_feedback_decay: beta > 0: what the codec dropped from a report is kept in a per-fragment accumulator
            and sent later (:mod:`diloco.wire.error_feedback`: e <- beta e + Delta, send Q(e), e <- e - Q(e));
            0 (default): off.
        budget_steps: > 0: the learners' shared budget, in steps of all learners together (``learner_budget=tokens``:
            M x ``steps``). The syncer counts their reported steps (``Reply.trained``); once a reply says the budget
            is spent, :attr:`budget_spent` is True and the trainer ends this learner after its step, early for a
            straggler, late for a fast one. 0 (default): off, the trainer ends it at its own ``steps``.
        own_steps: with ``budget_steps``: this learner's share (``steps``); from that step on it applies every reply in
            flight after each step (waiting if needed), so that it learns at once whether the others have trained
            the rest: learners in step (K = M, no straggler) end where ``steps`` would end them, bit for bit, when a
            report falls on step ``own_steps``; else within one report interval of it.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        channel: Channel,
        learner: int,
        sync_every: int,
        num_fragments: int = 1,
        fragment_pattern: Pattern = "strided",
        fragments: FragmentSpec | None = None,
        overlap_steps: int = 0,
        merge_alpha: float = 0.0,
        codec: str | Codec = "fp32",
        schedule: Schedule | Sequence[int] | str | None = None,
        tokens_per_step: float = 1.0,
        stats: CommStats | None = None,
        overwrite_after: str = "send",
        ride_out_steps: int = 0,
        error_feedback_decay: float = 0.0,
        budget_steps: int = 0,
        own_steps: int = 0,
    ) -> None:
        assert budget_steps >= 0 and own_steps >= 0, (budget_steps, own_steps)
        self.budget_steps, self.own_steps = budget_steps, own_steps
        self.trained = 0  # the learners' steps together, as the latest reply counted them (Reply.trained)
        self.overwrite_after = check_overwrite_after(overwrite_after)
        if not isinstance(ride_out_steps, int) or ride_out_steps < 0:
            raise ConfigError(
                f"ride_out_steps={ride_out_steps!r}: give the steps a learner trains on while a reply is "
                f"late, >= 0 (0: wait for it at once)"
            )
        self.ride_out_steps = ride_out_steps
        self._late: dict[int, int] = {}  # ride-out: fragment -> the last step before the learner waits for its reply
        self.ride_outs = 0  # replies that were late at t + tau and ridden out
        self.ride_out_waits = 0  # of those, the ones still missing B steps later (waited for)
        self.skipped_reports = 0  # reports not sent because the fragment's previous reply was still late
        self._arrived: dict[int, tuple[int, Reply]] = {}  # arrival mode: fragment -> (step seen, reply)
        if not 0.0 <= float(merge_alpha) <= 1.0:
            raise ConfigError(f"merge_alpha (alpha) must lie in [0, 1], got {merge_alpha}; 0 overwrites (the default)")
        self.model, self.channel, self.learner = model, channel, learner
        self.merge_alpha = float(merge_alpha)
        self.codec = get_codec(codec)
        self.tokens_per_step = float(tokens_per_step)
        self.stats = stats
        self._handles: dict[int, int] = {}
        self.schedule = resolve_schedule(schedule, sync_every, num_fragments, overlap_steps)
        self.fragments: list[Fragment] = split_fragments(
            model, num_fragments, pattern=fragment_pattern, fragments=fragments
        )
        welcome = channel.join()
        start = welcome.fragments
        self.incarnation = welcome.incarnation  # 0, or how many times this learner had joined before
        self.versions = list(welcome.versions)  # of the global fragments last received
        sizes = [f.numel for f in self.fragments]
        if [s.numel() for s in start] != sizes:
            raise ConfigError(
                f"the syncer's fragments have {[s.numel() for s in start]} values, this learner's "
                f"{sizes}: give both the same model, num_fragments and fragment_pattern"
            )
        # A model fully_shard'ed over a learner's ranks (worker_sharding=fsdp): each rank keeps its shard of the
        # global copy and of the parameters; reports are gathered whole, replies cut into each rank's shard.
        self.sharded = any(is_sharded(q) for q in model.parameters())
        # the global copy last received, per fragment (this rank's shards of it when sharded)
        self.base = [self._mine(p, s.detach().float()).clone() for p, s in enumerate(start)]
        self.error_feedback = (
            ErrorFeedback(sizes, decay=error_feedback_decay, device=self.base[0].device if self.base else None)
            if error_feedback_decay
            else None
        )
        for p in range(len(self.fragments)):
            merge_(self._targets(p), self._views(self.base[p], p), 0.0)
        self.step_count = welcome.step  # 0, or where the others are (a learner that joins late)
        self.steps = [0] * len(self.fragments)  # per fragment, since it was last received
        self.tokens = [0.0] * len(self.fragments)
        self._in_flight: dict[int, int] = {}  # fragment -> step its report was sent after
        self._busy = 0.0  # seconds of work since the previous report
        self._busy_steps = 0
        self._last_return: float | None = None
        self.wait_seconds = 0.0  # time spent waiting for replies, in total
        # time blocked in the other calls to the syncer (send, poll, hold, leave): near 0 while the link is up; a
        # syncer that is down, restarting or partitioned away shows here, not as compute
        self.blocked_seconds = 0.0

    def _call(self, name: str, *args: Any) -> Any:
        """``self.channel.<name>(*args)``, its time counted in :attr:`blocked_seconds`."""
        before = time.monotonic()
        try:
            return getattr(self.channel, name)(*args)
        finally:
            self.blocked_seconds += time.monotonic() - before

    # -- the loop hook -------------------------------------------------------
    def after_optimizer_step(self, *, tokens: float | None = None) -> list[SyncReport]:
        """Call after every inner optimizer step; ``tokens``: tokens this step trained on (default
        ``tokens_per_step``)."""
        tokens = self.tokens_per_step if tokens is None else tokens
        now = time.monotonic()
        if self._last_return is not None:
            self._busy += now - self._last_return
            self._busy_steps += 1
        self.step_count += 1
        t = self.step_count
        for p in range(len(self.fragments)):
            self.steps[p] += 1
            self.tokens[p] += float(tokens)
        if self.overwrite_after == "arrival":
            reports = self._arrival_step(t)
        elif self.ride_out_steps:
            reports = self._ride_out_step(t)
        else:
            for p in self.schedule.starts(t):
                self._send(p, t)
            reports = [self._overwrite(p, t) for p in self.schedule.finishes(t) if p in self._in_flight]
        if self.budget_steps and t >= self.own_steps and self._in_flight:
            reports += self.flush()  # past its share: the replies say whether the others have trained the rest
        self._last_return = time.monotonic()
        return reports

    @property
    def budget_spent(self) -> bool:
        """With ``budget_steps``: the latest reply counted the learners' shared budget as trained (the trainer ends
        this learner after its step); False without a budget."""
        return bool(self.budget_steps) and self.trained >= self.budget_steps

    def _arrival_step(self, t: int) -> list[SyncReport]:
        reports = []
        for p in self.schedule.starts(t):
            if p in self._in_flight:  # due again before its reply was applied: apply it now (waiting if needed)
                reports.append(self._overwrite(p, t))
            self._send(p, t)
        for p in sorted(self._in_flight):
            if p not in self._arrived:
                reply = self._call("poll_reply", p)
                if reply is not None:
                    self._arrived[p] = (t, reply)
        tau = self.schedule.overlap_steps
        reports += [self._overwrite(p, t) for p in sorted(self._arrived) if t >= self._arrived[p][0] + tau]
        return reports

    def _ride_out_step(self, t: int) -> list[SyncReport]:
        reports = []
        for p in sorted(self._late):  # late replies: apply one that came; wait for one past its bound
            reply = self._call("poll_reply", p)
            if reply is None and t < self._late[p]:
                continue
            if reply is None:
                self.ride_out_waits += 1
            del self._late[p]
            reports.append(self._overwrite(p, t, reply))
        for p in self.schedule.starts(t):
            if p in self._late:  # its previous reply is still out: no second report in flight; train on
                self.skipped_reports += 1
                continue
            self._send(p, t)
        for p in self.schedule.finishes(t):
            if p not in self._in_flight or p in self._late:
                continue
            reply = self._call("poll_reply", p)
            if reply is None:  # late: ride it out for up to B steps
                self._late[p] = t + self.ride_out_steps
                self.ride_outs += 1
                continue
            reports.append(self._overwrite(p, t, reply))
        return reports

    def flush(self) -> list[SyncReport]:
        """Wait for every reply still in flight and apply it now."""
        self._late.clear()
        return [self._overwrite(p, self.step_count) for p in sorted(self._in_flight)]

    def settle(self) -> list[SyncReport]:
        """At a checkpoint step, before :meth:`state_dict`: tell the syncer this learner holds here
        (:meth:`Channel.hold`), then :meth:`flush`. A run without interruption settles at the same steps.

        With ``ride_out_steps`` > 0 a checkpoint never waits (the syncer may be down, restarting): late replies that
        have arrived are applied, and the reports still out are left out of the checkpoint (their work is in the
        counters and the model; a learner restored from it reports it again, or takes the syncer's newer values)."""
        if self.ride_out_steps:
            reports = []
            for p in sorted(self._late):  # past due: apply one that has come (a reply not yet due waits its step)
                reply = self._call("poll_reply", p)
                if reply is not None:
                    del self._late[p]
                    reports.append(self._overwrite(p, self.step_count, reply))
            return reports
        self._call("hold", self.step_count)
        return self.flush()

    def close(self) -> list[SyncReport]:
        """Flush, then leave the syncer."""
        reports = self.flush()
        self._call("leave")
        return reports

    def finish(self) -> list[SyncReport]:
        """The run's last step: :meth:`close`. A learner that stays a member after its last report would hold up
        the others' last rounds (with K < M the last learner's report could wait for a quorum no one else
        will send)."""
        return self.close()

    # -- one fragment --------------------------------------------------------
    @torch.no_grad()
    def _send(self, p: int, t: int) -> None:
        assert p not in self._in_flight, "a fragment due again before its reply was applied (needs tau < H)"
        diff = self._whole(p, self.base[p] - flatten(self._targets(p)))
        if self.error_feedback is not None:  # the report is Q(e) of the fragment's accumulator; e keeps the rest
            payload, _ = self.error_feedback.step_(p, diff, encode=self.codec.encode, decode=self._decoder(p))
        else:
            payload = self.codec.encode(diff)
        step_time = self._busy / self._busy_steps if self._busy_steps else 0.0
        self._busy, self._busy_steps = 0.0, 0
        self._call(
            "send",
            Report(
                learner=self.learner,
                fragment=p,
                payload=payload,
                steps=self.steps[p],
                tokens=self.tokens[p],
                step_time=step_time,
                sent_after_step=t,
                base_version=self.versions[p],
            ),
        )
        self._in_flight[p] = t
        if self.stats is not None:  # the reply has the same size as the report
            n = self.codec.num_bytes(diff.numel())
            self._handles[p] = self.stats.start(f"fragment {p}", sent=n, received=n)

    @torch.no_grad()
    def _overwrite(self, p: int, t: int, reply: Reply | None = None) -> SyncReport:
        """Apply fragment p's reply: ``reply`` if given (already polled), else the one seen arriving, else the
        one waited for now."""
        started = self._in_flight.pop(p)
        if reply is None and p in self._arrived:
            reply = self._arrived.pop(p)[1]
        elif reply is None:
            before = time.monotonic()
            reply = self.channel.wait_reply(p)
            self.wait_seconds += time.monotonic() - before
        if p in self._handles:
            self.stats.finish(self._handles.pop(p))
        numel = self.fragments[p].numel
        decoded = self._mine(p, self.codec.decode(reply.payload, numel))
        self.base[p] = decoded if is_lossless(self.codec) else self.base[p] + decoded
        self.versions[p] = reply.version
        self.trained = max(self.trained, reply.trained)
        merge_(self._targets(p), self._views(self.base[p], p), self.merge_alpha)
        self.steps[p], self.tokens[p] = 0, 0.0
        return SyncReport(t, p, started, numel, self.codec.num_bytes(numel), reply.payload.numel())

    def _decoder(self, p: int):
        numel = self.fragments[p].numel
        return lambda payload: self.codec.decode(payload, numel)

    def _targets(self, p: int) -> list[torch.Tensor]:
        """Fragment p's parameters as this rank holds them (its shards when sharded; views, taken afresh)."""
        return local_shards(self.fragments[p].params)

    def _views(self, flat: torch.Tensor, p: int) -> list[torch.Tensor]:
        out, offset = [], 0
        for param in self._targets(p):
            out.append(flat[offset : offset + param.numel()].view(param.shape))
            offset += param.numel()
        return out

    def _whole(self, p: int, mine: torch.Tensor) -> torch.Tensor:
        """Fragment p's flat values from this rank's shards of them (a gather over the learner's ranks, which all
        call it together), laid out as the syncer's; ``mine`` itself when the model is not sharded."""
        if not self.sharded:
            return mine
        return flatten([shard_like(v, q).full_tensor() for v, q in zip(self._views(mine, p), self.fragments[p].params)])

    def _mine(self, p: int, whole: torch.Tensor) -> torch.Tensor:
        """This rank's shards of fragment p's flat values ``whole`` (every rank holds the same), flat; ``whole``
        itself when the model is not sharded."""
        if not self.sharded:
            return whole
        from torch.distributed.tensor import distribute_tensor

        pieces, offset = [], 0
        for q in self.fragments[p].params:
            value = whole[offset : offset + q.numel()].view(q.shape)
            offset += q.numel()
            if is_sharded(q):  # cut locally: every rank holds the same whole values, nothing is sent
                value = distribute_tensor(value, q.device_mesh, q.placements, src_data_rank=None).to_local()
            pieces.append(value.reshape(-1))
        return torch.cat(pieces) if pieces else whole

    @property
    def global_flat(self) -> list[torch.Tensor]:
        """The global copy per fragment as this rank holds it (sharded checkpoints read it)."""
        return self.base

    # -- global parameters and checkpoints -----------------------------------
    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict with the global values this learner last received."""
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        for p, frag in enumerate(self.fragments):
            for name, view, q in zip(frag.names, self._views(self.base[p], p), frag.params, strict=True):
                if name in state:
                    state[name] = shard_like(view.to(dtype=state[name].dtype).clone(), q)
        return state

    def state_dict(self) -> dict[str, Any]:
        if self._in_flight and not self.ride_out_steps:  # ride-out: those reports are left out (see settle)
            raise ConfigError(f"fragments {sorted(self._in_flight)} are in flight: call flush() before state_dict()")
        return {
            "step": self.step_count,
            "steps": list(self.steps),
            "tokens": list(self.tokens),
            "global": [b.clone() for b in self.base],  # the global copy last received (as StreamingDiLoCo's)
            "versions": list(self.versions),
            "trained": self.trained,  # the learners' steps together, as the latest reply counted them (a token budget)
        } | ({"error_feedback": self.error_feedback.state_dict()} if self.error_feedback is not None else {})

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` onto this learner, which has joined the syncer (its model's state loaded
        first). The syncer's fragments, given on joining, replace the saved copy: a fragment of the same version
        keeps the model's values and counters (the work done on it since, still on top of the global copy); a
        fragment the syncer has merged since (without this learner: K < M) is overwritten as a reply would be,
        its counters from zero. With K = M, saved right after a flush, every version matches: the learner goes
        on exactly as it was (with a lossless codec the copies are the same values)."""
        self.step_count = int(state["step"])
        self.steps = [int(s) for s in state["steps"]]
        self.tokens = [float(c) for c in state["tokens"]]
        self.trained = int(state.get("trained", 0))  # absent: written before it was kept
        saved = [int(v) for v in state.get("versions", self.versions)]
        assert len(saved) == len(self.fragments) == len(state["global"])
        for p, version in enumerate(saved):
            if version != self.versions[p]:  # stale: the syncer's values, as a reply would give them
                merge_(self._targets(p), self._views(self.base[p], p), self.merge_alpha)
                self.steps[p], self.tokens[p] = 0, 0.0
        if self.error_feedback is not None and "error_feedback" in state:
            self.error_feedback.load_state_dict(state["error_feedback"])


__all__ = ["Channel", "Learner"]
