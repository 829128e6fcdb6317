"""A site's learner channel to the syncer service over gRPC: no Ray at the site.

::

    channel = connect_site(learner=m, syncer="NAME@HOST:PORT", token=..., fingerprint=..., num_shards=S)
    algo = Learner(model, channel=channel, learner=m, ...)      # join, send, wait_reply, poll_reply, hold, leave

Each call has a deadline; a call that finds the service unreachable (``UNAVAILABLE``: refused, reset, a dead link
noticed by the keepalive pings within ~15 s; or its deadline passed) is tried again after a backoff of 0.2 s
doubling up to 2 s, for up to ``retry_for`` seconds (:data:`RETRY_FOR_S`), then raises a RuntimeError naming the
service and what it last said (the site's job stops; torchrun's ``--max-restarts`` restarts it, ``--resume auto``
resumes it). A report is sent, and its reply asked for, on a thread of the channel's, so the learner trains on
while the service is unreachable: with ``ride_out_steps`` B it rides the partition out for B steps, as through a
syncer restart, and waits after that. A report sent twice (its first answer lost) is ignored by the syncer.
A wrong token or syncer name is a ConfigError, never retried.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from diloco.decoupled.claim_lost import ClaimWatch
from diloco.decoupled.membership import HEARTBEAT_S, LEASE_S
from diloco.decoupled.messages import MAX_RESENDS, Reply, Report, Welcome, resend, taken
from diloco.decoupled.rpc import EPOCH_KEY, GRPC_MISSING, SERVICE, TOKEN_ENV
from diloco.decoupled.rpc.frames import pack, pack_report, unpack, unpack_reply, unpack_welcome
from diloco.errors import ConfigError, RunError

#: Seconds a call keeps trying an unreachable service before the learner gives up (its job then stops).
RETRY_FOR_S = 300.0
#: How many times a learner sends one report again (the service held no such report) before it gives up.
#: The deadline of one try of each call (seconds); a report's and a welcome's grow with their bytes.
DEADLINES = {"Ping": 5.0, "Hello": LEASE_S + 30.0, "Heartbeat": 5.0, "Join": 120.0, "Report": 60.0}
DEADLINES |= {"WaitReply": 60.0, "Leave": 60.0, "Hold": 60.0, "Status": 30.0, "Replicate": 30.0}
#: A connection's keepalive: a ping after this many seconds without one, and the seconds it may go unanswered
#: before the connection is called dead (its calls fail UNAVAILABLE and are tried again on a new one).
KEEPALIVE_S, PING_TIMEOUT_S = 10.0, 5.0
CLIENT_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.keepalive_time_ms", int(1000 * KEEPALIVE_S)),
    ("grpc.keepalive_timeout_ms", int(1000 * PING_TIMEOUT_S)),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    (
        "grpc.http2.ping_timeout_ms",
        int(1000 * PING_TIMEOUT_S),
    ),  # a ping not answered in 5 s ends the connection (bytes the link holds
    # are acknowledged by no one on a WAN that drops them: TCP_USER_TIMEOUT = keepalive_timeout catches those too)
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.enable_retries", 0),  # the retries are this module's (and say so)
    ("grpc.use_local_subchannel_pool", 1),  # a link's connection state is its own (a probe's is not the next's)
]


def parse_addresses(spec: str) -> tuple[str, list[tuple[str, int]]]:
    """``NAME@HOST:PORT[,HOST2:PORT2...]`` -> (name, [(host, port), ...]): the active syncer's address, then its
    standbys' (``diloco syncer --standby-of``); a ConfigError naming the form otherwise."""
    name, sep, addresses = str(spec).partition("@")
    found = []
    for address in addresses.split(",") if sep and name else []:
        host, _, port = address.strip().rpartition(":")
        if not host or not port.isdigit():
            found = []
            break
        found.append((host.strip("[]"), int(port)))
    if not found:
        raise ConfigError(
            f"syncer={spec!r}: give NAME@ADDRESS as `diloco syncer` printed it (e.g. "
            f"diloco-syncer-1a2b3c@10.0.0.1:7171, or with a standby diloco-syncer-1a2b3c@10.0.0.1:7171,10.0.0.2:7171; "
            f"also in its --out folder's syncer.json)"
        )
    return name, found


def parse_spec(spec: str) -> tuple[str, str, int]:
    """``NAME@HOST:PORT`` -> (name, host, port) (the first address of a list); a ConfigError naming the form
    otherwise."""
    name, addresses = parse_addresses(spec)
    return name, *addresses[0]


class Unreachable(RunError):
    """The service did not answer a call within its retries (what it last said is in the message): a failure
    outside the code (its monitor down longer than that, a partition), not a bug (the CLI raises it on as such)."""


class Link:
    """gRPC connections to a syncer service (its active address, then its standbys'), carrying the token and the
    newest epoch seen on every call (module docstring). A call that finds one address unreachable (or answering
    with an epoch older than the newest seen: a former active, whose connection is dropped) goes on at the next."""

    def __init__(self, spec: str, *, token: str | None = None, retry_for: float = RETRY_FOR_S) -> None:
        try:
            import grpc
        except ImportError:
            raise ConfigError(GRPC_MISSING) from None
        self._grpc = grpc
        self.spec = spec
        self.name, addresses = parse_addresses(spec)
        self.targets = [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in addresses]
        token = token if token is not None else os.environ.get(TOKEN_ENV, "")
        if not token:
            raise ConfigError(
                f"no token for the syncer {spec}: run the site's command as `diloco syncer` printed it (it sets "
                f"{TOKEN_ENV}=...; the token is also in the service's --out/syncer.json)"
            )
        self.token = token
        self.retry_for = retry_for
        self.retries = 0  # tries that failed and were made again
        self.switches = 0  # times a call went on at the next address
        self.stale_answers = 0  # answers ignored for an epoch older than the newest seen
        self.epoch = -1  # the newest epoch a syncer answered with (-1: none yet)
        self.bytes_sent = self.bytes_received = 0
        self._at = 0  # the address calls go to now
        self._lock = threading.Lock()
        self._channels: dict[int, Any] = {}
        self._stubs: dict[int, dict[str, Any]] = {}

    @property
    def target(self) -> str:
        return self.targets[self._at]

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("diloco-token", self.token), (EPOCH_KEY, str(max(self.epoch, 0))))

    def stub(self, method: str, at: int | None = None) -> Any:
        """The callable of ``method`` at address ``at`` (default: the current one), on a connection kept open."""
        at = self._at if at is None else at
        with self._lock:
            if at not in self._channels:
                self._channels[at] = self._grpc.insecure_channel(self.targets[at], options=CLIENT_OPTIONS)
                self._stubs[at] = {m: self._channels[at].unary_unary(f"/{SERVICE}/{m}") for m in DEADLINES}
            return self._stubs[at][method]

    def _drop(self, at: int) -> None:
        """Close the connection to address ``at`` and go on at the next address (unless another call moved on)."""
        with self._lock:
            channel = self._channels.pop(at, None)
            self._stubs.pop(at, None)
            if self._at == at and len(self.targets) > 1:
                self._at = (at + 1) % len(self.targets)
                self.switches += 1
        if channel is not None:
            channel.close()

    def _next(self, at: int) -> None:
        with self._lock:
            if self._at == at and len(self.targets) > 1:
                self._at = (at + 1) % len(self.targets)
                self.switches += 1

    def close(self) -> None:
        with self._lock:
            channels, self._channels, self._stubs = list(self._channels.values()), {}, {}
        for channel in channels:
            channel.close()

    def call(
        self,
        method: str,
        header: dict[str, Any] | bytes,
        *,
        timeout: float | None = None,
        retry_for: float | None = None,
    ) -> bytes:
        """One call (its request a header, or a frame already packed), tried again while the service is
        unreachable for up to ``retry_for`` seconds (module docstring), at the next address after each failure;
        the answer's bytes."""
        grpc = self._grpc
        request = header if isinstance(header, bytes) else pack({"syncer": self.name, **header})
        timeout = DEADLINES[method] if timeout is None else timeout
        began = time.monotonic()
        give_up = began + (self.retry_for if retry_for is None else retry_for)
        delay = 0.2
        while True:
            at = self._at
            try:
                answer, call = self.stub(method, at).with_call(request, timeout=timeout, metadata=self.metadata)
                epoch = answer_epoch(call)
                if accept_epoch(self.epoch, epoch):
                    self.epoch = max(self.epoch, epoch)
                    self.bytes_sent += len(request)
                    self.bytes_received += len(answer)
                    return answer
                self.stale_answers += 1  # a former active (module docstring): dropped, and the call goes on
                self._drop(at)
                code, details = grpc.StatusCode.UNAVAILABLE, f"epoch {epoch} is older than {self.epoch}: ignored"
            except grpc.RpcError as exc:
                code, details = exc.code(), exc.details()
                if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND):
                    raise ConfigError(details) from None
                if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise RuntimeError(
                        f"the syncer at {self.targets[at]} answered {method} with {code.name}: {details}"
                    ) from None
                self._next(at)
            if time.monotonic() + delay > give_up:
                raise Unreachable(
                    f"the syncer {self.spec} did not answer {method} for {time.monotonic() - began:.0f} s "
                    f"({self.retries} tries made again; last: {code.name}: {details}): the network to it is down "
                    f"or it stopped. The site's job stops here; torchrun --max-restarts restarts it and "
                    f"--resume auto resumes it from its newest checkpoint"
                ) from None
            self.retries += 1
            if self._at == 0 or len(self.targets) == 1:  # each address tried once since the last pause
                time.sleep(delay)
                delay = min(2 * delay, 2.0)


def answer_epoch(call: Any) -> int:
    """The epoch a syncer's answer carries (trailing metadata; 0 from a syncer that sends none)."""
    try:
        return int(dict(call.trailing_metadata() or ()).get(EPOCH_KEY, 0))
    except (TypeError, ValueError):
        return 0


def accept_epoch(newest: int, epoch: int) -> bool:
    """The fencing rule, a learner's side: an answer of an epoch older than the newest one seen is ignored (a former
    active that came back after a standby took over); one as new or newer is taken (and becomes the newest)."""
    return epoch >= newest


class RpcChannel(ClaimWatch):
    """One learner's :class:`~diloco.decoupled.learner.Channel` to one shard of the service over a :class:`Link`
    (what :class:`~diloco.decoupled.ray_channel.RayChannel` is in-cluster, with the same resend rule and
    session: a heartbeat every ``HEARTBEAT_S`` from a daemon thread, ``leave()`` says *finished*)."""

    def __init__(self, link: Link, learner: int, *, shard: int = 0, session: str | None = None) -> None:
        self.link, self.learner, self.shard, self.session = link, learner, shard, session
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix=f"syncer-rpc-{learner}")
        self._replies: dict[int, Future] = {}
        self._delivered: dict[int, Future] = {}
        self._sent: dict[int, Report] = {}
        self._stop = threading.Event()
        self._beating: threading.Thread | None = None
        self.resent = 0
        self._tries = 0

    def _head(self, **fields: Any) -> dict[str, Any]:
        return {"shard": self.shard, "learner": self.learner, **fields}

    def hello(self, fingerprint: dict[str, Any] | None) -> str | None:
        where = f"{socket.gethostname()} pid {os.getpid()}"  # for the status page's row
        answer, _ = unpack(
            self.link.call("Hello", self._head(session=self.session, fingerprint=fingerprint, host=where))
        )
        return answer["refused"]

    def join(self) -> Welcome:
        self._replies.clear()
        self._sent.clear()
        return unpack_welcome(self.link.call("Join", self._head()))

    def send(self, report: Report) -> None:
        self._sent[report.fragment] = self._checked(report)
        delivered: Future = Future()
        self._delivered[report.fragment] = delivered
        self._replies[report.fragment] = self._pool.submit(self._exchange, report, delivered)

    def _exchange(self, report: Report, delivered: Future) -> Reply | None:
        """Send ``report``, then ask for its reply (both tried again while the service is unreachable)."""
        try:
            frame = pack_report(report, syncer=self.link.name, shard=self.shard, session=self.session)
            timeout = DEADLINES["Report"] + len(frame) / 1e6  # at least 1 MB/s
            (answer, _) = unpack(self.link.call("Report", frame, timeout=timeout))
            at_epoch = self.link.epoch  # the epoch of the syncer that took it (a standby that took over after: lost)
            delivered.set_result(None)
        except BaseException as exc:
            lost = self._refused(exc)  # a job that lost its index: ClaimLost
            delivered.set_exception(lost)
            if lost is exc:
                raise
            raise lost from None
        ask = self._head(fragment=report.fragment, at=answer["at"], base_version=report.base_version)
        ask["at_epoch"] = at_epoch
        return unpack_reply(self.link.call("WaitReply", ask))

    def _resend(self, fragment: int) -> None:
        resend(self, fragment)

    def wait_reply(self, fragment: int) -> Reply:
        self._check_claim()
        while (reply := self._replies.pop(fragment).result()) is None:
            self._resend(fragment)
        del self._sent[fragment]
        self._tries = 0
        return reply

    def poll_reply(self, fragment: int) -> Reply | None:
        self._check_claim()
        if not self._replies[fragment].done():
            return None
        return taken(self, fragment, self._replies.pop(fragment).result())

    def hold(self, step: int) -> None:
        self._check_claim()
        for f in list(self._delivered.values()):  # the reports first: the syncer holds every one when this returns
            f.result()
        self._delivered.clear()
        self.link.call("Hold", self._head(step=step, session=self.session))

    def start_heartbeat(self) -> None:
        assert self.session is not None, "a heartbeat needs a session"
        if self._beating is None:
            name = f"syncer-heartbeat-{self.learner}-{self.shard}"
            self._beating = threading.Thread(target=self._beat, name=name, daemon=True)
            self._beating.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                answer, _ = unpack(self.link.call("Heartbeat", self._head(session=self.session), retry_for=0.0))
                self._beat_answer(answer.get("lost"))  # another job holds the index now: this one stops
            except Exception:  # unreachable for now: the next beat tries again
                continue

    def leave(self, *, finished: bool | None = None) -> None:
        """Stop: the syncer no longer counts this learner. With a session, ``finished`` defaults to True."""
        self._stop.set()
        done = (self.session is not None) if finished is None else finished
        try:
            self.link.call("Leave", self._head(finished=bool(done), session=self.session), retry_for=60.0)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)


def connect_site(
    *,
    learner: int,
    syncer: str,
    num_shards: int = 1,
    fingerprint: dict[str, Any] | None = None,
    token: str | None = None,
    retry_for: float = RETRY_FOR_S,
) -> Any:
    """Learner ``learner``'s channel to the service ``syncer`` (NAME@HOST:PORT) over gRPC: one
    :class:`RpcChannel` per shard (a :class:`~diloco.decoupled.shards.ShardedChannel` when S > 1), each index
    claimed with ``fingerprint`` and held by a heartbeat; a refusal is a ConfigError saying why. ``token``:
    default the environment's ``DILOCO_SYNCER_TOKEN``."""
    from diloco.decoupled.shards import sharded

    link = Link(syncer, token=token, retry_for=retry_for)
    session = uuid.uuid4().hex
    channels: list[RpcChannel] = []
    try:
        for s in range(num_shards):
            channel = RpcChannel(link, learner, shard=s, session=session)
            refused = channel.hello(fingerprint)
            if refused is not None:
                raise ConfigError(refused)
            channels.append(channel)
            channel.start_heartbeat()
    except BaseException:
        for c in channels:  # the claims made at the shards that granted them
            try:
                c.leave(finished=False)
            except Exception:
                pass
        link.close()
        raise
    return sharded(channels)


__all__ = [
    "DEADLINES",
    "KEEPALIVE_S",
    "MAX_RESENDS",
    "PING_TIMEOUT_S",
    "RETRY_FOR_S",
    "Link",
    "accept_epoch",
    "answer_epoch",
    "parse_addresses",
    "RpcChannel",
    "Unreachable",
    "connect_site",
    "parse_spec",
]
