"""A learner's channel to the syncer actor of :mod:`diloco.decoupled.ray_transport`: :class:`RayChannel`, and
:func:`connect`, which finds the actor by name (Ray started or joined first) and, given the run's fingerprint, claims
the learner's index and holds it with a heartbeat::

    channel = connect(learner=m, fingerprint=fp)    # in a thread, a Ray task or actor, or a process of the cluster
    algo = Learner(model, channel=channel, learner=m, sync_every=8, overlap_steps=2)
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import ray

from diloco.decoupled.claim_lost import ClaimWatch
from diloco.decoupled.membership import HEARTBEAT_S
from diloco.decoupled.messages import Reply, Report, Welcome, resend, taken
from diloco.decoupled.ray_transport import DEFAULT_NAME, DEFAULT_NAMESPACE, init
from diloco.decoupled.status.host import whoami
from diloco.errors import ConfigError


class RayChannel(ClaimWatch):
    """One learner's :class:`diloco.decoupled.learner.Channel` to the named syncer actor.

    It keeps its last report of each fragment until the reply comes, and sends it again if a restarted
    syncer says it holds no such report (a repeat of a report it has merged is ignored by the syncer).

    With a ``session`` (:func:`connect` with ``fingerprint=`` makes one) the learner holds its index: a daemon
    thread beats every ``HEARTBEAT_S``, and :meth:`leave` says the learner finished unless ``finished=False``
    (the learner's own ``leave`` comes after its last step)."""

    def __init__(self, actor: Any, learner: int, *, session: str | None = None) -> None:
        self.actor, self.learner, self.session = actor, learner, session
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None
        self._replies: dict[int, Any] = {}  # fragment -> the reply's ObjectRef, asked for when the report is sent
        self._sent: dict[int, Report] = {}
        self._delivered: dict[int, Any] = {}  # fragment -> the ObjectRef of its report call
        self.resent = 0
        self._tries = 0

    def join(self) -> Welcome:
        self._replies.clear()
        self._sent.clear()
        return ray.get(self.actor.join.remote(self.learner))

    def send(self, report: Report) -> None:
        self._sent[report.fragment] = self._checked(report)
        self._delivered[report.fragment] = self.actor.report_from.remote(report, self.session)  # not waited on
        self._replies[report.fragment] = self.actor.wait_reply.remote(
            self.learner, report.fragment, time.time(), report.base_version
        )

    def _resend(self, fragment: int) -> None:
        resend(self, fragment)

    def wait_reply(self, fragment: int) -> Reply:
        self._check_claim()
        while (reply := self._reply(fragment)) is None:
            self._resend(fragment)
        del self._sent[fragment]
        self._tries = 0
        return reply

    def _reply(self, fragment: int) -> Reply | None:
        """The reply to the report of ``fragment`` (None: the syncer holds no such report), or ClaimLost as soon as
        that report was refused for a lost claim: the syncer would otherwise wait ``RESEND_AFTER_S`` for it."""
        ref = self._replies.pop(fragment)
        if fragment in self._delivered:  # (not after a hold, which waited for every report and forgot them)
            ray.wait([ref, self._delivered[fragment]], num_returns=1)  # the reply, or the report's call ending first
            self._refused_report(fragment)
        return ray.get(ref)

    def _refused_report(self, fragment: int) -> None:
        """ClaimLost where the report of ``fragment`` came back refused for a lost claim (its call's error)."""
        try:
            ray.get(ray.wait([self._delivered[fragment]], timeout=0)[0] if fragment in self._delivered else [])
        except Exception as exc:  # refused for another reason: its reply says so (None: the report sent again)
            if (lost := self._refused(exc)) is not exc:
                raise lost from None

    def poll_reply(self, fragment: int) -> Reply | None:
        self._check_claim()
        self._refused_report(fragment)
        ready, _ = ray.wait([self._replies[fragment]], timeout=0)
        if not ready:
            return None
        return taken(self, fragment, ray.get(self._replies.pop(fragment)))

    def start_heartbeat(self) -> None:
        """Beat for this channel's session every ``HEARTBEAT_S`` from a daemon thread, until :meth:`leave`."""
        assert self.session is not None, "a heartbeat needs a session"
        if self._beating is None:
            self._beating = threading.Thread(target=self._beat, name=f"syncer-heartbeat-{self.learner}", daemon=True)
            self._beating.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S) and ray.is_initialized():  # (a call after shutdown would start Ray)
            try:
                self._beat_answer(ray.get(self.actor.beat.remote(self.learner, self.session), timeout=10 * HEARTBEAT_S))
            except Exception:  # the syncer restarting, or Ray going down: the next beat tries again
                continue

    def leave(self, *, finished: bool | None = None) -> None:
        """Stop: the syncer no longer counts this learner. With a session, ``finished`` defaults to True."""
        self._stop.set()
        if self.session is None:
            ray.get(self.actor.leave.remote(self.learner))
            return
        done = True if finished is None else finished
        ray.get(self.actor.leave.remote(self.learner, done, self.session))

    def hold(self, step: int) -> None:
        self._check_claim()
        for fragment in list(self._delivered):  # Ray does not keep the order of calls to an async actor: the reports
            ray.wait([self._delivered[fragment]])  # first (one refused for a lost claim: ClaimLost)
            self._refused_report(fragment)
        ray.get(list(self._delivered.values()))
        self._delivered.clear()
        ray.get(self.actor.hold_from.remote(self.learner, step, self.session))


def connect(
    *,
    learner: int,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    address: str | None = None,
    fingerprint: dict[str, Any] | None = None,
) -> RayChannel:
    """Learner ``learner``'s channel to the syncer actor ``name`` (Ray started / joined first if needed).

    ``fingerprint``: claim the index first (:meth:`SyncerActor.hello`, with a new session; a refusal is a
    ConfigError saying why) and hold it with a heartbeat until the channel leaves."""
    init(address=address, namespace=namespace)
    try:
        actor = ray.get_actor(name, namespace=namespace)
    except ValueError:
        where = f" at {address}" if address else ""
        raise ConfigError(
            f"no syncer named {name!r} in Ray namespace {namespace!r}{where}: start one with "
            f"`diloco syncer` (or start_syncer(syncer, name={name!r})) first, or pass the name it printed"
        ) from None
    if fingerprint is None:
        return RayChannel(actor, learner)
    channel = RayChannel(actor, learner, session=uuid.uuid4().hex)
    refused = ray.get(actor.hello.remote(learner, channel.session, fingerprint, whoami()))
    if refused is not None:
        raise ConfigError(refused)
    channel.start_heartbeat()
    return channel


__all__ = ["RayChannel", "connect"]
