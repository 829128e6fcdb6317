"""The torch.distributed backend: one replica per process (gloo on CPU, nccl on GPU).

Runs the same algorithm code as the in-process backend (:mod:`diloco.comm.local`):
the exchanges of :mod:`diloco.comm.base` are built on two collectives on 1-D
uint8 tensors, ``all_gather_single`` and an all-to-all (uneven splits): on gloo
M-1 pairwise rounds of ``isend``/``irecv`` on a helper thread, tagged with the
collective's number (see :class:`_PairwiseWork`), elsewhere ``all_to_all_single``;
all asynchronous, so a fragment's exchange travels while the next inner steps
compute. Device-agnostic: tensors go to ``self.device`` (the
current CUDA device under nccl, CPU otherwise) and results come back to the
caller's device.

Bytes on the wire. The counts in :class:`~diloco.comm.accounting.CommStats` are
what crosses each rank's link, from :mod:`diloco.traffic`: an all-gather (ring
in gloo and NCCL, or direct) moves (M-1) n bytes each way per rank; the
reduce-scatter exchange's all-to-all and all-gather of shards move 2(M-1)/M n.
See docs/guides/distributed.md.

Faults. Collectives are matched by order, as everywhere in torch.distributed.
A peer that died makes gloo fail fast ("connection reset by peer"); a peer that
hangs is caught by ``wait(timeout)`` after ``timeout_s`` seconds. Either way
:class:`~diloco.comm.base.CommError` is raised naming the collective (its tag,
e.g. ``"fragment 2"``, and its sequence number) and the rank(s) at fault, read
from the rendezvous store, where every rank records the number of the

collective it last entered and, from a heartbeat thread, that it is alive:
a rank that never entered the collective is *behind* (hung, or dead if its
heartbeat stopped). After a failure the communicator refuses further work:
the process group is no longer usable and the process should exit (the
trainer then resumes from its last checkpoint).
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from diloco.comm.accounting import CommStats
from diloco.comm.base import CommError, Communicator, Work
from diloco.errors import ConfigError

_KEY_PREFIX = "diloco_comm"
# torch >= 2.9 renamed all_gather_into_tensor (deprecated since) to all_gather_single.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _Heartbeat:
    """A daemon thread that increments ``alive/<global rank>`` in the store every ``interval_s``.

    One per process: a peer whose counter stops moving is dead or stopped
    (SIGSTOP, frozen VM), which tells such a peer apart from one that is alive but
    stuck before a collective.
    """

    _current: _Heartbeat | None = None
    _lock = threading.Lock()
    # A daemon thread still inside a store call while the interpreter finalizes aborts the process
    # ("terminate called without an active exception"): stop it first, whatever the caller forgot.
    _atexit_registered = False

    def __init__(self, store: dist.Store, global_rank: int, interval_s: float) -> None:
        self.store, self.global_rank, self.interval_s = store, global_rank, interval_s
        self._stop = threading.Event()
        self.store.add(self._key(global_rank), 1)
        self._thread = threading.Thread(target=self._run, name="diloco-heartbeat", daemon=True)
        self._thread.start()

    @classmethod
    def ensure(cls, store: dist.Store, global_rank: int, interval_s: float) -> _Heartbeat:
        """The process's heartbeat, (re)started if the process group (its store or rank) changed."""
        with cls._lock:
            hb = cls._current
            if hb is None or not hb._thread.is_alive() or hb.global_rank != global_rank or hb.store is not store:
                if hb is not None:
                    hb.stop()
                hb = cls._current = cls(store, global_rank, interval_s)
                if not cls._atexit_registered:
                    atexit.register(cls.stop_current)
                    cls._atexit_registered = True
            return hb

    def stop(self) -> None:
        """Stop beating and wait for the thread, so no store call is in flight at teardown."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10 * self.interval_s)

    @classmethod
    def stop_current(cls) -> None:
        with cls._lock:
            if cls._current is not None:
                cls._current.stop()
                cls._current = None

    @staticmethod
    def _key(global_rank: int) -> str:
        return f"{_KEY_PREFIX}/alive/{global_rank}"

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.store.add(self._key(self.global_rank), 1)
            except Exception:
                return

    def counters(self, global_ranks: Sequence[int]) -> dict[int, int]:
        """Each rank's beat count (adding 0 reads a counter without blocking on a missing key)."""
        return {r: self.store.add(self._key(r), 0) for r in global_ranks}


def name_culprits(
    *, seq: int, last_entered: dict[int, int], silent: Sequence[int], heartbeat: bool, label=lambda rank: ""
) -> list[str]:
    """What a failed collective #seq says about the peers: who never reached it, who went silent.

    Args:
        last_entered: each peer's number of the last collective it entered (from the store).
        silent: the peers whose heartbeat did not move while this rank watched.
        heartbeat: whether heartbeats were watched at all (otherwise ``silent`` means nothing).
        label: extra text after a rank's number (e.g. its global rank).
    """
    behind = [r for r in sorted(last_entered) if last_entered[r] < seq]
    # A peer that reached the collective and then went silent, while another silent peer never reached
    # it, most often failed on the same fault (it met the dead rank first, gave up and exited), so it is
    # named apart from that culprit. With no silent peer behind, the silent peers are the culprits
    # (e.g. killed inside the collective).
    dead = [r for r in silent if r in behind]
    followed = [r for r in silent if r not in behind]
    if not dead:
        dead, followed = followed, []
    parts = []
    if behind:
        detail = ", ".join(f"rank {r}{label(r)} last entered #{last_entered[r]}" for r in behind)
        parts.append(f"rank(s) {behind} never reached it ({detail})")
    if dead:
        parts.append(f"rank(s) {dead} stopped responding (heartbeat stopped: process dead or stopped)")
    if followed:
        parts.append(
            f"rank(s) {followed} entered it and then stopped responding (they failed inside it, "
            "probably on the same fault, and exited)"
        )
    if behind and not dead and heartbeat:
        parts.append("their heartbeat is alive: hung or slower than the timeout")
    if not behind and not silent:
        parts.append("every peer had entered it and is alive: a peer failed inside the collective")
    return parts


class _TorchWork(Work):
    def __init__(
        self,
        comm: TorchDistCommunicator,
        work,
        out: torch.Tensor,
        numel: int | list[int],
        seq: int,
        what: str,
        result_device: torch.device,
    ) -> None:
        self._comm, self._work, self._out, self._numel = comm, work, out, numel
        self._seq, self._what, self._device = seq, what, result_device
        self._result: list[torch.Tensor] | None = None

    def wait(self) -> list[torch.Tensor]:
        if self._result is None:
            self._comm._wait(self._work, self._seq, self._what)
            self._result = [c.to(self._device) for c in self._out.split(self._numel)]
        return self._result

    def is_completed(self) -> bool:
        return self._result is not None or bool(self._work.is_completed())


class _PairwiseWork(Work):
    """An all-to-all in M-1 rounds on a helper thread: in round k this rank sends its chunk for rank
    ``rank + k`` and receives the one from ``rank - k`` (``isend``/``irecv``, tagged with the collective's
    number), so every link carries one flow each way at a time, as a ring does (gloo's own all-to-all
    sends to all peers at once). Each round posts its receive before its send: see ``run`` below; with
    sends first these rounds ran at ~60 % of the link rate on shaped links (benchmarks/link_collectives.py).
    Being matched by tag, not by issue order, these rounds may be issued from a helper thread: that is
    what lets the reduce-scatter exchange run entirely in the background."""

    def __init__(
        self, comm: TorchDistCommunicator, chunks, recv_sizes, seq: int, what: str, result_device: torch.device
    ) -> None:
        self._comm, self._seq, self._what, self._device = comm, seq, what, result_device
        M, me = comm.world_size, comm.rank
        src = [c.to(comm.device) for c in chunks]
        self._bufs = [torch.empty(n, dtype=torch.uint8, device=comm.device) for n in recv_sizes]
        self._bufs[me] = src[me]
        self._error: BaseException | None = None
        self._result: list[torch.Tensor] | None = None

        def run() -> None:
            try:
                for k in range(1, M):
                    to, frm = (me + k) % M, (me - k) % M
                    works = []
                    # The receive first: gloo sends a payload only once the receiver's ready notice has
                    # arrived, and that notice shares the TCP connection with this rank's own payload to the
                    # same peer (round k = M/2 pairs partners both ways); posted after the send it can queue
                    # behind the whole payload, and the two directions then run one after the other
                    # (benchmarks/link_collectives.py --recv-first: partner rounds 45 % -> 96 % of the rate).
                    if self._bufs[frm].numel():
                        works.append(dist.irecv(self._bufs[frm], src=comm.global_ranks[frm], group=comm.group, tag=seq))
                    if src[to].numel():
                        works.append(dist.isend(src[to], dst=comm.global_ranks[to], group=comm.group, tag=seq))
                    for w in works:
                        w.wait()
            except BaseException as exc:
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"diloco-all-to-all-{seq}", daemon=True)
        self._thread.start()

    def wait(self) -> list[torch.Tensor]:
        if self._result is None:
            t0 = time.monotonic()
            self._thread.join(timeout=self._comm.timeout_s)
            if self._thread.is_alive():
                exc = TimeoutError(f"{self._what} still running after {self._comm.timeout_s:g}s")
                self._comm._fail(self._comm._diagnose(self._what, self._seq, exc, time.monotonic() - t0), exc)
            if self._error is not None:
                self._comm._fail(
                    self._comm._diagnose(self._what, self._seq, self._error, time.monotonic() - t0), self._error
                )
            self._result = [b.to(self._device) for b in self._bufs]
        return self._result

    def is_completed(self) -> bool:
        return self._result is not None or not self._thread.is_alive()


class _DoneWork(Work):
    """World of one: nothing to exchange."""

    def __init__(self, payload: torch.Tensor) -> None:
        self._payload = payload

    def wait(self) -> list[torch.Tensor]:
        return [self._payload]

    def is_completed(self) -> bool:
        return True


class TorchDistCommunicator(Communicator):
    """This process's endpoint in the replica group ``group`` (default: the whole world).

    Args:
        group: the process group of the replicas (one rank per replica); ``None`` is the default group.
            With workers of several ranks, see :mod:`diloco.comm.mesh` instead.
        timeout_s: how long ``wait()``, :meth:`broadcast_` and :meth:`barrier` wait for the peers
            before raising :class:`CommError`. Counted from the call to ``wait()``, so an exchange
            overlapped with tau inner steps gets those steps on top. The process group's own timeout
            (``init_process_group(timeout=...)``) bounds one collective in gloo's worker thread: keep it
            at least as long as the slowest legitimate transfer.
        store: the rendezvous store where ranks record their progress, used to name the rank(s) at
            fault; default the default process group's store. ``None`` and no default store: errors
            cannot name the missing ranks.
        heartbeat_s: interval of the liveness heartbeat (0 disables it).
        pairwise_all_to_all: run all-to-alls as M-1 rounds of point-to-point transfers on a helper
            thread (one peer per round) instead of ``all_to_all_single``; default: on for gloo, off for
            nccl (whose all-to-all already is grouped point-to-point on the GPU's own streams).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        timeout_s: float,
        store: dist.Store | None = None,
        heartbeat_s: float = 0.5,
        pairwise_all_to_all: bool | None = None,
    ) -> None:
        if not dist.is_available() or not dist.is_initialized():
            raise ConfigError(
                "torch.distributed is not initialized: call torch.distributed.init_process_group(...) first "
                "(under torchrun: diloco.distributed.init_from_env())"
            )
        if not timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0 seconds, got {timeout_s}")
        self.group = group
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ConfigError(f"this process (global rank {dist.get_rank()}) is not a member of the given group")
        self.world_size = dist.get_world_size(group)
        self.global_ranks: list[int] = dist.get_process_group_ranks(group or dist.group.WORLD)
        self.timeout_s = float(timeout_s)
        backend = str(dist.get_backend(group)).lower()
        self.device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        self.pairwise_all_to_all = (backend == "gloo") if pairwise_all_to_all is None else bool(pairwise_all_to_all)
        self.stats = CommStats()
        self._seq = 0
        self._failed: str | None = None
        self._name = "world" if group is None else "g" + "-".join(map(str, self.global_ranks))
        if store is None:
            try:
                store = dist.distributed_c10d._get_default_store()
            except Exception:
                store = None
        self._store = store
        self._heartbeat = None
        if store is not None and heartbeat_s > 0:
            self._heartbeat = _Heartbeat.ensure(store, dist.get_rank(), heartbeat_s)

    # -- backend hooks ---------------------------------------------------------
    def _start_all_gather(self, payload: torch.Tensor, tag: str) -> Work:
        what = f"all-gather {tag!r}" if tag else "all-gather"
        seq = self._enter(what)
        if self.world_size == 1:
            return _DoneWork(payload)
        src = payload.to(self.device).contiguous()
        out = torch.empty(self.world_size * src.numel(), dtype=torch.uint8, device=self.device)
        work = self._issue(what, seq, lambda: _all_gather_single(out, src, group=self.group, async_op=True))
        return _TorchWork(self, work, out, src.numel(), seq, what, payload.device)

    def _can_pipeline(self) -> bool:
        # pairwise rounds are matched by their tag (the collective's number), not by issue order
        return self.pairwise_all_to_all and self.world_size > 1

    def _reserve(self, what: str) -> int:
        return self._enter(what)

    def _start_all_to_all(
        self, chunks: Sequence[torch.Tensor], recv_sizes: Sequence[int], tag: str, seq: int | None = None
    ) -> Work:
        what = f"all-to-all {tag!r}" if tag else "all-to-all"
        if seq is None:
            seq = self._enter(what)
        else:
            assert self._can_pipeline(), "a reserved number needs tagged (pairwise) all-to-alls"
        if self.world_size == 1:
            return _DoneWork(chunks[0])
        device = chunks[self.rank].device
        if self.pairwise_all_to_all:
            return _PairwiseWork(self, chunks, recv_sizes, seq, what, device)
        src = torch.cat([c.reshape(-1) for c in chunks]).to(self.device)
        out = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=self.device)
        send_sizes = [c.numel() for c in chunks]
        work = self._issue(
            what,
            seq,
            lambda: dist.all_to_all_single(
                out,
                src,
                output_split_sizes=list(recv_sizes),
                input_split_sizes=send_sizes,
                group=self.group,
                async_op=True,
            ),
        )
        return _TorchWork(self, work, out, list(recv_sizes), seq, what, device)

    def broadcast_(self, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
        """One broadcast per dtype: the tensors are packed into one flat buffer (few large messages)."""
        if not 0 <= src < self.world_size:
            raise ConfigError(f"src must be a rank of the group, 0..{self.world_size - 1}; got {src}")
        what = f"broadcast from rank {src}"
        seq = self._enter(what)
        if self.world_size == 1:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        global_src = self.global_ranks[src]
        for members in by_dtype.values():  # insertion order: the same on every rank
            flat = torch.cat([t.detach().reshape(-1).to(self.device) for t in members])
            work = self._issue(what, seq, lambda f=flat: dist.broadcast(f, global_src, group=self.group, async_op=True))
            self._wait(work, seq, what)
            if self.rank != src:
                offset = 0
                with torch.no_grad():
                    for t in members:
                        t.copy_(flat[offset : offset + t.numel()].view_as(t))
                        offset += t.numel()

    def barrier(self) -> None:
        seq = self._enter("barrier")
        if self.world_size > 1:
            self._wait(
                self._issue("barrier", seq, lambda: dist.barrier(group=self.group, async_op=True)), seq, "barrier"
            )

    def close(self) -> None:
        """Stop this process's heartbeat thread: call before ``destroy_process_group`` and exit.

        Peers that fail afterwards will report this rank as "stopped responding", which by then it has.
        """
        if self._heartbeat is not None:
            _Heartbeat.stop_current()
            self._heartbeat = None

    # -- progress, waiting, diagnosis -------------------------------------------
    def _enter(self, what: str) -> int:
        """Number the next collective and record in the store that this rank reached it."""
        if self._failed is not None:
            raise CommError(
                f"rank {self.rank}: cannot start {what}: this communicator failed earlier "
                f"({self._failed}); restart the run (e.g. from the last checkpoint)"
            )
        self._seq += 1
        if self._store is not None and self.world_size > 1:
            try:
                self._store.set(self._progress_key(self.rank), str(self._seq))
            except Exception as exc:
                self._fail(
                    f"rank {self.rank}: the rendezvous store is unreachable before {what} "
                    f"(collective #{self._seq}); its host may have died: {exc}",
                    exc,
                )
        return self._seq

    def _issue(self, what: str, seq: int, start):
        try:
            return start()
        except Exception as exc:
            self._fail(self._diagnose(what, seq, exc, 0.0), exc)

    def _wait(self, work, seq: int, what: str) -> None:
        t0 = time.monotonic()
        try:
            work.wait(timeout=timedelta(seconds=self.timeout_s))
        except Exception as exc:
            self._fail(self._diagnose(what, seq, exc, time.monotonic() - t0), exc)

    def _fail(self, message: str, cause: BaseException):
        self._failed = message
        raise CommError(message) from cause

    def _progress_key(self, rank: int) -> str:
        return f"{_KEY_PREFIX}/{self._name}/seq/{rank}"

    def _diagnose(self, what: str, seq: int, exc: BaseException, waited_s: float) -> str:
        """Name the ranks that never entered collective #seq, and those whose heartbeat stopped."""
        head = (
            f"rank {self.rank} of {self.world_size}: {what} (collective #{seq}) failed after "
            f"{waited_s:.1f}s (timeout {self.timeout_s:g}s)"
        )
        backend_msg = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        if self._store is None:
            return f"{head}; cannot name the missing rank(s) without a store; backend: {backend_msg}"
        peers = [r for r in range(self.world_size) if r != self.rank]
        try:
            silent: list[int] = []
            if self._heartbeat is not None:
                globals_ = [self.global_ranks[r] for r in peers]
                before = self._heartbeat.counters(globals_)
                time.sleep(2.5 * self._heartbeat.interval_s)
                after = self._heartbeat.counters(globals_)
                silent = [r for r, g in zip(peers, globals_, strict=True) if after[g] == before[g]]
            # read after the heartbeat window: a live peer that was merely a moment behind has entered by now
            last = {
                r: (int(self._store.get(k)) if self._store.check([k]) else 0)
                for r in peers
                for k in [self._progress_key(r)]
            }
        except Exception as store_exc:
            return f"{head}; could not read the peers' progress from the store ({store_exc}); backend: {backend_msg}"
        parts = [
            head,
            *name_culprits(
                seq=seq, last_entered=last, silent=silent, heartbeat=self._heartbeat is not None, label=self._global
            ),
        ]
        parts.append(f"backend: {backend_msg}")
        return "; ".join(parts)

    def _global(self, rank: int) -> str:
        g = self.global_ranks[rank]
        return "" if g == rank else f" (global rank {g})"
