"""Streaming DiLoCo (and plain DiLoCo, its case P = 1, tau = 0) for any model and inner optimizer.

One instance per replica, called explicitly after every inner optimizer step::

    algo = StreamingDiLoCo(model, comm=comm, sync_every=30, num_fragments=4,
                           overlap_steps=1, merge_alpha=0.5, codec="fp4_e3m0")
    for x, y in batches:
        loss = model(x, y)[1]; loss.backward()
        inner_opt.step(); inner_opt.zero_grad()
        algo.step()            # list of SyncReport (possibly empty)

Per fragment p, when the schedule starts its sync (after step t):
    outer gradient  Delta_p = global_p - local_p      (FP32)
    payload         = comm.encode(Delta_p, codec), sent asynchronously (comm.mean_async)
and when it finishes (after step t + tau):
    mean Delta_p    = FP32 average of every replica's decoded payload (non-finite ones dropped;
                      all-gather for M <= 2, reduce-scatter above: see diloco.comm.base)
    global_p        <- OuterOpt_p(global_p, mean Delta_p)     (one optimizer state per fragment)
    local_p         <- alpha * local_p + (1 - alpha) * global_p

The global copy of each fragment is kept as one flat FP32 vector (optionally on
another device, e.g. CPU, to save accelerator memory); the outer optimizer
steps that flat vector, which is exact for element-wise optimizers such as SGD
with (Nesterov) momentum or Adam.

The contribution guard (``guard``, :mod:`diloco.algorithm.guard`): before sending, each replica compares
the norm of its own Delta_p per inner step since p's previous sync (the first sync of p comes after
fewer steps than H) with the running median of its own accepted ones; one above
``guard_ratio`` times it is sent as non-finite (``"drop"``: the exchange leaves this replica out and every
replica, this one included, applies the others' mean, as for a diverged replica) or scaled down to the bar
(``"clip"``). What the exchange cannot check: the others' values arrive summed (reduce-scatter) or are
only averaged, so a replica can only vouch for its own contribution; a replica whose check itself is
broken is not caught. Under FSDP each rank judges its own shard.

Two options change what is sent and applied:

* ``error_feedback_decay`` = beta > 0: the payload is ``encode(e)`` of a per-fragment
  accumulator ``e <- beta e + Delta_p``, which keeps what the codec dropped
  (:mod:`diloco.wire.error_feedback`);
* ``eager=True`` (with tau = H): each sync applies this replica's own share of
  what it just sent at once and the others' average one round later
  (:mod:`diloco.algorithm.eager`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from diloco.algorithm.base import ReplicaAlgorithm, SyncReport, broadcast_parameters, local_shard, local_shards
from diloco.algorithm.eager import eager_landing, eager_outer_gradient, eager_share
from diloco.algorithm.fragments import Fragment, FragmentSpec, Pattern, flatten, split_fragments
from diloco.algorithm.guard import DEFAULT_GUARD_RATIO, NormGuard
from diloco.algorithm.outer import OuterOptimizerFactory, default_outer_optimizer, load_global_state, merge_
from diloco.algorithm.schedule import Schedule, resolve_schedule
from diloco.comm.base import Communicator, MeanWork
from diloco.errors import ConfigError
from diloco.wire.codec import Codec
from diloco.wire.error_feedback import ErrorFeedback
from diloco.wire.registry import get_codec


@dataclass
class _Pending:
    started_at: int
    payload: torch.Tensor
    work: MeanWork
    share: torch.Tensor | None = None  # eager: this replica's share of the mean, already applied


class StreamingDiLoCo(ReplicaAlgorithm):
    """One replica's Streaming DiLoCo state: schedule, fragments, global copy, outer optimizers.

    Args:
        model: this replica's model (any ``nn.Module``); its trainable parameters are the local ones.
        comm: this replica's communicator.
        sync_every: H, inner steps between two syncs of one fragment.
        num_fragments: P; 1 is plain DiLoCo.
        fragment_pattern: ``"strided"`` or ``"sequential"`` block assignment (see :mod:`fragments`).
        fragments: explicit fragments (lists of names, parameters or modules), overriding the pattern.
        overlap_steps: tau, inner steps an exchange overlaps with before it is applied (0 <= tau < H).
        merge_alpha: alpha, weight of the local parameters in the merge (0 = take the global ones).
        codec: wire format of the outer gradients (name or :class:`Codec`).
        outer_optimizer: factory ``f(list_of_tensors) -> Optimizer``; default SGD(0.7, momentum 0.9, Nesterov).
        offload_device: where the global copy and outer optimizer state live (default: the model's device).
        schedule: when each fragment syncs (the staggering): ``None``/``"even"`` sends fragment p after
            ``floor((p+1) H/P)`` and merges tau steps later; ``"torchft"`` sends after ``(p+1) H/P - tau``
            and merges after ``(p+1) H/P`` (torchft 0.2.0); a tuple of P offsets (first send step of
            each fragment, 1..H); or a :class:`Schedule` with the same H, P and tau. See
            :mod:`diloco.algorithm.schedule` for the conventions.
        eager: eager updates (needs ``overlap_steps == sync_every``): a whole outer step overlaps the
            exchange; this replica's share is applied at once, the others' one round later.
        error_feedback_decay: beta of the per-fragment error-feedback accumulator ``e <- beta e + Delta``
            (0, the default: no error feedback; 1: classic; SparseLoCo 0.95, MuLoCo 0.9).
        guard: the contribution guard on this replica's own outer gradient before it is sent (module
            docstring): ``"drop"`` (default), ``"clip"`` or ``"off"`` (no check: the behaviour before the guard).
            A sync it acted in reports it (:attr:`SyncReport.guard`); 3 drops in a row raise a ``RuntimeWarning``.
        guard_ratio: the bar on norm / running median of this replica's accepted norms (default 10).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        comm: Communicator,
        sync_every: int,
        num_fragments: int = 1,
        fragment_pattern: Pattern = "strided",
        fragments: FragmentSpec | None = None,
        overlap_steps: int = 0,
        merge_alpha: float = 0.0,
        codec: str | Codec = "fp32",
        outer_optimizer: OuterOptimizerFactory | None = None,
        offload_device: torch.device | str | None = None,
        schedule: Schedule | Sequence[int] | str | None = None,
        eager: bool = False,
        error_feedback_decay: float = 0.0,
        guard: str = "drop",
        guard_ratio: float = DEFAULT_GUARD_RATIO,
    ) -> None:
        if not 0.0 <= float(merge_alpha) <= 1.0:
            raise ConfigError(f"merge_alpha (alpha) must lie in [0, 1], got {merge_alpha}")
        self.model = model
        self.comm = comm
        self.eager = bool(eager)
        self.schedule: Schedule = resolve_schedule(schedule, sync_every, num_fragments, overlap_steps, eager=self.eager)
        self.merge_alpha = float(merge_alpha)
        self.codec = get_codec(codec)
        self.guard = NormGuard(action=guard, max_ratio=float(guard_ratio), who="replica")
        self._guard_events: dict[int, dict[str, Any]] = {}  # fragment -> the guard's event of the sync in flight
        self._guard_sent_at: dict[int, int] = {}  # fragment -> the step its previous sync started after
        self.fragments: list[Fragment] = split_fragments(
            model, num_fragments, pattern=fragment_pattern, fragments=fragments
        )
        broadcast_parameters(model, comm)  # identical start on every replica, by construction
        first = local_shards(self.fragments[0].params[:1])[0]
        device = torch.device(offload_device) if offload_device is not None else first.device
        factory = outer_optimizer or default_outer_optimizer
        self.global_flat: list[torch.Tensor] = []
        self.outer_optimizers: list[torch.optim.Optimizer] = []
        for frag in self.fragments:
            g = flatten(local_shards(frag.params)).to(device).requires_grad_(True)
            self.global_flat.append(g)
            self.outer_optimizers.append(factory([g]))
        self.error_feedback: ErrorFeedback | None = None
        if error_feedback_decay:
            # Beside the model (not the offloaded global copy): the payload is encoded where Delta is.
            self.error_feedback = ErrorFeedback(
                [g.numel() for g in self.global_flat], decay=error_feedback_decay, device=first.device
            )
        self.step_count = 0
        self._pending: dict[int, _Pending] = {}
        # Exchanges dropped by an elastic restart (fragment -> step started): finished as skipped syncs.
        self._dropped_in_flight: dict[int, int] = {}
        # Exchanges :meth:`flush` finished before their scheduled step: that step has nothing left to finish.
        self._flushed: set[int] = set()

    # -- the loop hooks (ReplicaAlgorithm) -----------------------------------
    def after_optimizer_step(self) -> list[SyncReport]:
        """Call after every inner optimizer step (or :meth:`step`): starts and finishes the syncs the schedule says."""
        self.step_count += 1
        t = self.step_count
        if self.eager:  # a fragment's finish (the previous exchange) coincides with its next start
            assert set(self.schedule.finishes(t)) <= set(self.schedule.starts(t))
            return [r for p in self.schedule.starts(t) for r in self._eager_sync(p, t)]
        for p in self.schedule.starts(t):
            self._start(p, t)
        due = self.schedule.finishes(t)
        reports = [self._finish(p, t) for p in due if p not in self._flushed]
        self._flushed.difference_update(due)
        return reports

    def flush(self) -> list[SyncReport]:
        """Finish every exchange still in flight now (e.g. at the end of training).

        Training may go on afterwards (a finished run resumed with a larger budget): the steps at which
        the flushed exchanges were due then have nothing to finish.

        Eager: each landing average swaps this replica's share out for it in one more outer step (none
        at M = 1, where the two are equal), so every contribution has been applied exactly once; a
        flushed fragment's next sync has nothing to land.
        """
        in_flight = sorted(set(self._pending) | set(self._dropped_in_flight))
        if self.eager:
            return [self._eager_landing(p, self.step_count) for p in in_flight]
        self._flushed.update(in_flight)
        return [self._finish(p, self.step_count) for p in in_flight]

    # -- one fragment's sync -------------------------------------------------
    def _outer_gradient(self, p: int) -> torch.Tensor:
        frag, g = self.fragments[p], self.global_flat[p]
        local = flatten(local_shards(frag.params))  # a fresh copy: the outer gradient overwrites it
        return torch.sub(g.detach().to(local.device), local, out=local)

    def _guarded(self, p: int, delta: torch.Tensor, t: int) -> torch.Tensor:
        """``delta`` (sent after step t) as the guard lets it go: unchanged, scaled down (clip), or all NaN (drop:
        the exchange leaves this replica out). Nothing is computed with the guard off."""
        if not self.guard.on:
            return delta
        steps = max(1, t - self._guard_sent_at.get(p, 0))
        self._guard_sent_at[p] = t
        norm = float(torch.linalg.vector_norm(delta)) / steps
        if not norm < float("inf"):  # non-finite: the exchange drops it already
            return delta
        verdict = self.guard.judge(p, norm, sender=self.comm.rank)
        event = self.guard.record(self.comm.rank, p, verdict)
        if event is None:
            return delta
        self._guard_events[p] = event.as_row(who="replica")
        return delta.fill_(float("nan")) if verdict.action == "drop" else delta.mul_(verdict.scale)

    def _encode(self, p: int, delta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(payload, what the peers will decode from it: only computed where it is needed)."""
        n = delta.numel()

        def encode(values: torch.Tensor) -> torch.Tensor:
            return self.comm.encode(values, self.codec)

        def decode(payload: torch.Tensor) -> torch.Tensor:
            return self.comm.decode_own(payload, codec=self.codec, numel=n)

        if self.error_feedback is not None:
            return self.error_feedback.step_(p, delta, encode=encode, decode=decode)
        payload = encode(delta)
        return payload, (decode(payload) if self.eager else None)

    @torch.no_grad()
    def _start(self, p: int, t: int) -> None:
        delta = self._guarded(p, self._outer_gradient(p), t)
        payload, _ = self._encode(p, delta)
        work = self.comm.mean_async(payload, codec=self.codec, numel=delta.numel(), tag=f"fragment {p}")
        self._pending[p] = _Pending(t, payload, work)

    def _outer_step(self, p: int, grad: torch.Tensor) -> None:
        g = self.global_flat[p]
        g.grad = grad.to(g.device)
        self.outer_optimizers[p].step()
        g.grad = None

    def _land(self, p: int, t: int) -> tuple[SyncReport, torch.Tensor | None, torch.Tensor | None]:
        """Wait for fragment p's exchange in flight (eager): (report, the mean or None, the share it swaps)."""
        g = self.global_flat[p]
        if p in self._dropped_in_flight:  # an elastic restart dropped it: the others' shares are lost,
            started = self._dropped_in_flight.pop(p)  # this replica's own stays applied
            return SyncReport(t, p, started, g.numel(), 0, 0, skipped=True), None, None
        pending = self._pending.pop(p)
        mean, dropped = pending.work.wait()
        link = pending.work.link_bytes
        report = SyncReport(
            t,
            p,
            pending.started_at,
            g.numel(),
            link.sent,
            link.received,
            dropped,
            guard=self._guard_events.pop(p, None),
        )
        report.skipped = mean is None
        assert pending.share is not None, "an eager exchange in flight without its share"
        return report, mean, pending.share

    @torch.no_grad()
    def _eager_sync(self, p: int, t: int) -> list[SyncReport]:
        """Eager sync of fragment p after step t: send, land the previous average, one outer step, merge."""
        delta = self._guarded(p, self._outer_gradient(p), t)
        payload, sent = self._encode(p, delta)
        assert sent is not None
        share = eager_share(sent, self.comm.world_size)
        reports, mean, landed_share = [], None, None
        if p in self._pending or p in self._dropped_in_flight:  # waited on before the next one starts
            report, mean, landed_share = self._land(p, t)
            reports.append(report)
        work = self.comm.mean_async(payload, codec=self.codec, numel=delta.numel(), tag=f"fragment {p}")
        self._pending[p] = _Pending(t, payload, work, share)
        self._outer_step(p, eager_outer_gradient(share, landed_mean=mean, landed_share=landed_share))
        merge_(local_shards(self.fragments[p].params), self._views(p), self.merge_alpha)
        return reports

    @torch.no_grad()
    def _eager_landing(self, p: int, t: int) -> SyncReport:
        report, mean, landed_share = self._land(p, t)
        if landed_share is not None and self.comm.world_size > 1:  # at M = 1 the mean is the share: nothing
            self._outer_step(p, eager_landing(landed_mean=mean, landed_share=landed_share))
            merge_(local_shards(self.fragments[p].params), self._views(p), self.merge_alpha)
        return report

    @torch.no_grad()
    def _finish(self, p: int, t: int) -> SyncReport:
        if p in self._dropped_in_flight:  # no exchange to wait for: merge with the unchanged global copy
            g = self.global_flat[p]
            merge_(local_shards(self.fragments[p].params), self._views(p), self.merge_alpha)
            return SyncReport(t, p, self._dropped_in_flight.pop(p), g.numel(), 0, 0, skipped=True)
        pending = self._pending.pop(p)
        mean, dropped = pending.work.wait()
        g = self.global_flat[p]
        link = pending.work.link_bytes
        report = SyncReport(
            t,
            p,
            pending.started_at,
            g.numel(),
            link.sent,
            link.received,
            dropped,
            guard=self._guard_events.pop(p, None),
        )
        if mean is None:
            report.skipped = True
        else:
            self._outer_step(p, mean)
        merge_(local_shards(self.fragments[p].params), self._views(p), self.merge_alpha)
        return report

    def _views(self, p: int) -> list[torch.Tensor]:
        g, out, offset = self.global_flat[p].detach(), [], 0
        for param in local_shards(self.fragments[p].params):
            out.append(g[offset : offset + param.numel()].view(param.shape))
            offset += param.numel()
        return out

    # -- global parameters ---------------------------------------------------
    def global_named_parameters(self) -> dict[str, torch.Tensor]:
        """Name -> global (outer) value of every trainable parameter (views into the flat copies;
        this rank's shard of it for a ``fully_shard``'ed model)."""
        return {n: v for p, f in enumerate(self.fragments) for n, v in zip(f.names, self._views(p), strict=True)}

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict with trainable parameters replaced by their global values: evaluate this.

        A parameter registered under several names (tied weights: e.g. GPT-2's ``lm_head.weight`` and
        ``transformer.wte.weight``) gets its global value under every name, so loading the result
        cannot bring back a local value through an alias.
        """
        state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        glob = self.global_named_parameters()
        canonical = {id(p): n for n, p in self.model.named_parameters()}
        for name, param in self.model.named_parameters(remove_duplicate=False):  # tied weights: every alias
            value = glob.get(canonical.get(id(param), ""))
            if value is None or name not in state:
                continue
            ref = state[name]
            value = value.to(device=local_shard(ref).device, dtype=ref.dtype).clone()
            if hasattr(ref, "device_mesh"):  # a fully_shard'ed parameter: this rank's shard of the DTensor
                from torch.distributed.tensor import DTensor

                value = DTensor.from_local(value, ref.device_mesh, ref.placements, shape=ref.shape, stride=ref.stride())
            state[name] = value
        return state

    @property
    def pending_fragments(self) -> tuple[int, ...]:
        return tuple(sorted(self._pending))

    # -- checkpointing -------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Global params, outer optimizer states, step counter, in-flight exchanges (their payloads and,
        eager, the shares already applied) and the error-feedback accumulators."""

        def pending(x: _Pending) -> dict[str, Any]:
            entry = {"started_at": x.started_at, "payload": x.payload.clone()}
            return entry | ({"share": x.share.clone()} if x.share is not None else {})

        return (
            {
                "step": self.step_count,
                "global": [g.detach().clone() for g in self.global_flat],
                "outer_optimizers": [o.state_dict() for o in self.outer_optimizers],
                "pending": {p: pending(x) for p, x in self._pending.items()},
                "comm_stats": self.comm.stats.state_dict(),
            }
            | ({"dropped_in_flight": dict(self._dropped_in_flight)} if self._dropped_in_flight else {})
            | ({"guard": self.guard.state_dict() | {"sent_at": dict(self._guard_sent_at)}} if self.guard.on else {})
            | ({"error_feedback": self.error_feedback.state_dict()} if self.error_feedback is not None else {})
        )

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; in-flight exchanges are re-issued (every replica must load the same step).

        ``state["dropped_in_flight"]`` (fragment -> step started; an elastic restart moves ``pending``
        there, as contributions encoded for the old peers cannot be exchanged with the new ones): those
        fragments are not exchanged; at their finish step the local copy merges with the unchanged
        global one (a skipped sync: the fragment loses one outer step).
        """
        load_global_state(self.global_flat, self.outer_optimizers, state, owner="run")
        if self.error_feedback is not None:
            if "error_feedback" not in state:
                raise ConfigError(
                    "this run uses error feedback but the checkpoint has no accumulators; resume "
                    "with the error-feedback decay the checkpoint was written with"
                )
            self.error_feedback.load_state_dict(state["error_feedback"])
        if self.guard.on and "guard" in state:  # a checkpoint without it (guard off, or older): the guard starts afresh
            self.guard.load_state_dict(state["guard"])
            self._guard_sent_at = {int(p): int(t) for p, t in state["guard"].get("sent_at", {}).items()}
        self.step_count = int(state["step"])
        self._pending = {}
        self._dropped_in_flight = {int(p): int(v) for p, v in state.get("dropped_in_flight", {}).items()}
        # What the schedule has in flight at this step but the checkpoint does not was flushed before it was saved.
        self._flushed = (
            set(self.schedule.pending_after(self.step_count))
            - {int(p) for p in state["pending"]}
            - set(self._dropped_in_flight)
        )
        for p in sorted(state["pending"]):
            entry = state["pending"][p]
            payload = entry["payload"]
            if self.eager and "share" not in entry:
                raise ConfigError(
                    f"fragment {p}'s exchange in flight has no eager share in the checkpoint: "
                    f"it was not written by an eager run; resume with eager=False"
                )
            work = self.comm.mean_async(
                payload, codec=self.codec, numel=self.global_flat[int(p)].numel(), tag=f"fragment {p} (resumed)"
            )
            share = entry["share"].clone() if self.eager else None
            self._pending[int(p)] = _Pending(int(entry["started_at"]), payload, work, share)
        # The re-issued exchanges were already counted before the checkpoint.
        self.comm.stats.load_state_dict(state["comm_stats"])

    def fragment_sizes(self) -> Sequence[int]:
        return [g.numel() for g in self.global_flat]

    def state_bytes(self) -> dict[str, int]:
        """Memory this algorithm adds to the model and inner optimizer, by part (bytes, this replica)."""

        def size(t: torch.Tensor) -> int:
            return t.numel() * t.element_size()

        outer = sum(
            size(v)
            for o in self.outer_optimizers
            for st in o.state.values()
            for v in st.values()
            if isinstance(v, torch.Tensor)
        )
        return {
            "global": sum(size(g) for g in self.global_flat),
            "outer_optimizer": outer,
            "error_feedback": self.error_feedback.num_bytes() if self.error_feedback is not None else 0,
            "eager_shares": sum(size(x.share) for x in self._pending.values() if x.share is not None),
            "payloads_in_flight": sum(size(x.payload) for x in self._pending.values()),
        }
