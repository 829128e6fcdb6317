"""The in-process transport: the syncer on a thread of its own, learners on theirs, queues between.

::

    syncer = Syncer(make_model(), num_learners=3, quorum=1, overlap_steps=2)
    with LocalTransport(syncer) as transport:
        results = run_learners(train_one, transport)      # train_one(channel, learner) per thread
    syncer.global_named_parameters()                       # safe to read once the transport has stopped

Only the syncer's thread touches the syncer while the transport runs. Payloads are passed as tensors
(no copy on the wire); byte counts are the payloads' sizes.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from diloco.comm.base import CommError
from diloco.decoupled.messages import Reply, Report, Welcome
from diloco.decoupled.syncer import Syncer
from diloco.errors import RunError

T = TypeVar("T")
_STOP = object()


class TransportError(RunError):
    """The syncer's thread failed, or a reply did not come in time."""


class LocalTransport:
    """Runs ``syncer`` on a background thread until :meth:`stop` (or the ``with`` block ends)."""

    def __init__(self, syncer: Syncer, *, timeout: float = 120.0) -> None:
        self.syncer = syncer
        self.timeout = timeout
        self._inbox: queue.Queue = queue.Queue()
        self._outboxes = {m: queue.Queue() for m in range(syncer.num_learners)}
        self._error: BaseException | None = None
        self._aborted: str | None = None  # why the run stopped (abort); learners' next calls raise CommError
        self._thread = threading.Thread(target=self._serve, name="diloco-syncer", daemon=True)
        self._thread.start()

    def __enter__(self) -> LocalTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the syncer's thread; re-raises what failed there."""
        if self._thread.is_alive():
            self._inbox.put(_STOP)
            self._thread.join(self.timeout)
        if self._error is not None:
            raise TransportError(f"the syncer failed: {self._error!r}") from self._error

    def abort(self, reason: str) -> None:
        """The run stops (e.g. a learner diverged): every learner's next wait or poll raises
        :class:`~diloco.comm.base.CommError` (a peer's failure, not the cause); the syncer's thread runs on until
        :meth:`stop`."""
        self._aborted = reason

    def _check_aborted(self) -> None:
        if self._aborted is not None:
            raise CommError(f"the run stopped on another learner: {self._aborted}")

    def state_dict(self) -> dict[str, Any]:
        """The syncer's :meth:`~diloco.decoupled.syncer.Syncer.state_dict`, read on its thread (between two of the
        messages it serves)."""
        return self._call(self.syncer.state_dict)

    def channel(self, learner: int) -> LocalChannel:
        return LocalChannel(self, learner)

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the syncer's thread and return its result."""
        done: queue.Queue = queue.Queue()
        self._inbox.put(("call", fn, done))
        ok, value = self._get(done)
        if not ok:
            raise value
        return value

    def _get(self, q: queue.Queue) -> Any:
        deadline = time.monotonic() + self.timeout
        while True:
            if self._error is not None:
                raise TransportError(f"the syncer failed: {self._error!r}") from self._error
            self._check_aborted()
            try:
                return q.get(timeout=min(0.05, max(deadline - time.monotonic(), 0.0)))
            except queue.Empty:
                if time.monotonic() >= deadline:
                    raise TransportError(f"nothing from the syncer within {self.timeout} s") from None

    def _dispatch(self, replies: list[Reply]) -> None:
        for r in replies:
            self._outboxes[r.learner].put(r)

    def _serve(self) -> None:
        try:
            while True:
                deadline = self.syncer.next_deadline()
                wait = None if deadline is None else max(0.0, deadline - self.syncer.clock())
                try:
                    msg = self._inbox.get(timeout=wait)
                except queue.Empty:
                    self._dispatch(self.syncer.poll())
                    continue
                if msg is _STOP:
                    return
                if isinstance(msg, Report):
                    self._dispatch(self.syncer.receive(msg))
                else:
                    _, fn, done = msg
                    try:
                        done.put((True, fn()))
                    except Exception as exc:
                        done.put((False, exc))
                self._dispatch(self.syncer.poll())
        except BaseException as exc:
            self._error = exc


class LocalChannel:
    """One learner's :class:`diloco.decoupled.learner.Channel` over a :class:`LocalTransport`."""

    def __init__(self, transport: LocalTransport, learner: int) -> None:
        self.transport, self.learner = transport, learner
        self._stash: dict[int, Reply] = {}

    def join(self) -> Welcome:
        return self.transport._call(lambda: self.transport.syncer.join(self.learner))

    def send(self, report: Report) -> None:
        self.transport._inbox.put(report)

    def wait_reply(self, fragment: int) -> Reply:
        while fragment not in self._stash:
            reply = self.transport._get(self.transport._outboxes[self.learner])
            self._stash[reply.fragment] = reply
        return self._stash.pop(fragment)

    def poll_reply(self, fragment: int) -> Reply | None:
        self.transport._check_aborted()
        outbox = self.transport._outboxes[self.learner]
        while True:
            try:
                reply = outbox.get_nowait()
            except queue.Empty:
                break
            self._stash[reply.fragment] = reply
        return self._stash.pop(fragment, None)

    def leave(self) -> None:
        self.transport._call(lambda: self.transport._dispatch(self.transport.syncer.leave(self.learner)))

    def hold(self, step: int) -> None:  # after this learner's reports: the inbox keeps their order
        self.transport._call(lambda: self.transport._dispatch(self.transport.syncer.hold(self.learner, step)))


def run_learners(fn: Callable[[LocalChannel, int], T], transport: LocalTransport) -> list[T]:
    """Run ``fn(channel, learner)`` for every learner 0..M-1, one thread each; results in learner order.

    The first exception raised by a learner is re-raised here (after every thread has ended).
    """
    M = transport.syncer.num_learners
    results: list[Any] = [None] * M
    errors: list[BaseException] = []

    def target(m: int) -> None:
        try:
            results[m] = fn(transport.channel(m), m)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(m,), name=f"diloco-learner-{m}") for m in range(M)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


__all__ = ["LocalChannel", "LocalTransport", "TransportError", "run_learners"]
