"""The syncer's gRPC endpoint for the sites: a server in the ``diloco syncer`` process that forwards each call.

::

    gateway = Gateway(ray_backend(shards.handles), name=name, token=token, host="0.0.0.0", port=7171)
    port = gateway.start()          # sites now reach NAME@THIS_HOST:port
    ...
    gateway.stop()

Why a gateway in the service process rather than the actor serving gRPC itself: the actor is restarted by Ray
(from its checkpoint, after a SIGKILL) and may come back on another node with another port; the service process
holds one address for the whole run, and a call it forwards while the actor restarts is retried by Ray on the new
incarnation (the actor's ``max_task_retries=-1``), so a site sees a slow call, not a lost one. The syncer stays a
transport-free state machine inside its actor; this module holds no syncer state (a ``backend`` does the calls).

Every call is checked before it reaches the backend: the token (gRPC metadata ``diloco-token``;
``UNAUTHENTICATED`` when wrong or missing), the syncer's name (``NOT_FOUND``: a site started with another run's
command) and the shard (``INVALID_ARGUMENT``). A backend that does not answer in time or is restarting is
``UNAVAILABLE`` (the learner retries); what the syncer refuses is ``FAILED_PRECONDITION`` with its message.

Epochs (:mod:`.replicate`): every answer carries the gateway's ``epoch`` (trailing metadata ``diloco-epoch``), every
learner's call the newest epoch it has seen. A call that has seen a newer epoch than this gateway's fences it: a
standby took over from this syncer, so from then on it answers every call ``UNAVAILABLE`` (the learner goes on at
its next address) and merges nothing more. With a ``replicator`` (a standby attached), an answer that tells a
learner of the syncer's state (a granted claim, a join's welcome, a merge's reply, a leave, a hold) waits until the standby holds
that state (:meth:`~diloco.decoupled.rpc.replicate.Replicator.gate`).
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from diloco.decoupled.membership import LEASE_S
from diloco.decoupled.rpc import DEFAULT_PORT, EPOCH_KEY, GRPC_MISSING, METHODS, SERVICE
from diloco.decoupled.rpc.frames import (
    FrameError,
    pack,
    pack_reply,
    pack_welcome,
    unpack,
    unpack_report,
)
from diloco.errors import ConfigError

#: Seconds a forwarded wait_reply may take (the actor gives up on a report after RESEND_AFTER_S = 30 s).
WAIT_REPLY_S = 45.0
#: Seconds any other forwarded call may take before the learner is told to retry (a merge and its checkpoint
#: may hold the actor's event loop for a while).
CALL_S = 60.0
#: gRPC's settings: no message size limit (a welcome holds every fragment in FP32), keepalive pings allowed
#: (the learners use them to notice a dead link in ~15 s), and no second server on the same port.
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    ("grpc.so_reuseport", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5000),
    ("grpc.http2.max_ping_strikes", 0),
]

#: (shard, method, args, timeout) -> the actor's answer; raises TimeoutError where it does not answer in time,
#: ConnectionError where it is down, and RuntimeError with the syncer's message where it refused.
Backend = Callable[[int, str, tuple, float], Any]


def ray_backend(handles: list[Any], num_shards: int) -> tuple[Backend, int]:
    """The backend over Ray actor handles (a syncer's shards, in shard order) and the number of shards.
    ``handles`` may be filled after the gateway started (it binds its port before the service writes anything):
    until then every call is ``UNAVAILABLE`` and the learners try again."""

    def call(shard: int, method: str, args: tuple, timeout: float) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        if len(handles) != num_shards:
            raise ConnectionError("the syncer is starting")
        try:
            return ray.get(getattr(handles[shard], method).remote(*args), timeout=timeout)
        except GetTimeoutError:
            raise TimeoutError(
                f"the syncer did not answer {method} within {timeout:g} s (busy or restarting)"
            ) from None
        except RayActorError as exc:
            raise ConnectionError(f"the syncer actor is down ({type(exc).__name__}); Ray restarts it") from None
        except RayTaskError as exc:
            raise RuntimeError(str(exc.cause if getattr(exc, "cause", None) is not None else exc)) from None

    return call, num_shards


class Gateway:
    """The gRPC server of one syncer service (module docstring). ``backend``/``shards``: :func:`ray_backend`'s
    pair; ``name``: the syncer's name the sites give; ``token``: what every call must carry."""

    def __init__(
        self,
        backend: tuple[Backend, int],
        *,
        name: str,
        token: str,
        host: str = "0.0.0.0",
        port: int = DEFAULT_PORT,
        workers: int = 64,
        epoch: int = 0,
        replicator: Any = None,
    ) -> None:
        assert token, "a gateway needs a token"
        (self.call, self.shards), self.name, self.token = backend, name, token
        self.host, self.port, self.workers = host, port, workers
        self.calls = 0
        self.epoch, self.replicator = int(epoch), replicator
        self.fenced_by: int | None = None  # the newer epoch a learner named (module docstring); None: not fenced
        self._server: Any = None

    # -- the server ------------------------------------------------------------
    def start(self) -> int:
        """Serve; returns the port bound (``port=0``: one the system picked). A port in use is a ConfigError."""
        try:
            import grpc
        except ImportError:
            raise ConfigError(GRPC_MISSING) from None
        handlers = {
            m: grpc.unary_unary_rpc_method_handler(self._handler(getattr(self, f"_{m.lower()}"))) for m in METHODS
        }
        server = grpc.server(ThreadPoolExecutor(max_workers=self.workers), options=SERVER_OPTIONS)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        where = f"{self.host}:{self.port}" if ":" not in self.host else f"[{self.host}]:{self.port}"
        try:
            bound = server.add_insecure_port(where)
        except RuntimeError:
            bound = 0
        if not bound:
            raise ConfigError(
                f"cannot serve the sites on {where} (the port is taken, or the address is not this machine's): "
                f"give another --port, or stop what holds it"
            )
        server.start()
        self._server, self.port = server, bound
        return bound

    def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def _handler(self, body: Callable[[dict[str, Any], list, Any], bytes]) -> Callable[[bytes, Any], bytes]:
        import grpc

        def handle(request: bytes, context: Any) -> bytes:
            self.calls += 1
            given = dict(context.invocation_metadata()).get("diloco-token", "")
            if not hmac.compare_digest(str(given).encode(), self.token.encode()):
                why = "no token" if not given else "a wrong token"
                context.abort(
                    grpc.StatusCode.UNAUTHENTICATED,
                    f"the syncer {self.name} refused a call with {why}: run the site with the token `diloco syncer` "
                    f"printed (DILOCO_SYNCER_TOKEN=... in its learner command; also in its --out's syncer.json)",
                )
            context.set_trailing_metadata(((EPOCH_KEY, str(self.epoch)),))
            seen = _epoch_of(dict(context.invocation_metadata()).get(EPOCH_KEY))
            if seen > self.epoch:
                self.fenced_by = max(seen, self.fenced_by or 0)
            if self.fenced_by is not None:
                context.abort(
                    grpc.StatusCode.UNAVAILABLE,
                    f"the syncer {self.name} of epoch {self.epoch} was replaced by a standby that took over (epoch "
                    f"{self.fenced_by}): it merges nothing more; the learner goes on at its next address",
                )
            try:
                header, tensors = unpack(request)
            except FrameError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a diloco syncer request: {exc}")
            if header.get("syncer") != self.name:
                context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"this address serves the syncer {self.name!r}, not {header.get('syncer')!r}: give the "
                    f"syncer=NAME@ADDRESS that this run's `diloco syncer` printed",
                )
            shard = header.get("shard", 0)
            if not isinstance(shard, int) or not 0 <= shard < self.shards:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"shard {shard!r}: this syncer has syncer_shards={self.shards}; give the learner the syncer's "
                    f"syncer_shards",
                )
            try:
                return body(header, tensors, shard)
            except TimeoutError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            except ConnectionError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            except RuntimeError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))

        return handle

    # -- the calls -------------------------------------------------------------
    def _gate(self, since: float) -> None:
        """Wait until the standby (if one is attached) holds the state as of ``since`` (monotonic)."""
        if self.replicator is not None:
            self.replicator.gate(since)

    def _ping(self, header: dict, tensors: list, shard: int) -> bytes:
        return pack({"syncer": self.name, "shards": self.shards, "time": time.time(), "epoch": self.epoch})

    def _hello(self, header: dict, tensors: list, shard: int) -> bytes:
        args = (int(header["learner"]), str(header["session"]), header.get("fingerprint"), header.get("host"))
        refused = self.call(shard, "hello", args, LEASE_S + CALL_S)
        if refused is None:  # the claim granted: in the standby's copy before the job hears it holds the index
            self._gate(time.monotonic())
        return pack({"refused": refused})

    def _heartbeat(self, header: dict, tensors: list, shard: int) -> bytes:
        # None: held; else why this job's claim went to another (it stops: diloco.decoupled.claim_lost)
        lost = self.call(shard, "beat", (int(header["learner"]), str(header["session"])), CALL_S)
        return pack({"held": lost is None, "lost": lost})

    def _join(self, header: dict, tensors: list, shard: int) -> bytes:
        welcome = self.call(shard, "join", (int(header["learner"]),), CALL_S)
        self._gate(time.monotonic())
        return pack_welcome(welcome)

    def _report(self, header: dict, tensors: list, shard: int) -> bytes:
        at = time.time()  # this host's clock: what the actor compares with its start (no clock across the WAN)
        self.call(shard, "report_from", (unpack_report(header, tensors), header.get("session")), CALL_S)
        return pack({"at": at})

    def _waitreply(self, header: dict, tensors: list, shard: int) -> bytes:
        # a report taken by the syncer of an older epoch went down with it: sent "before this syncer started"
        at = float(header["at"]) if int(header.get("at_epoch", self.epoch)) >= self.epoch else 0.0
        args = (int(header["learner"]), int(header["fragment"]), at, int(header["base_version"]))
        reply = self.call(shard, "wait_reply", args, WAIT_REPLY_S)
        self._gate(time.monotonic())
        return pack_reply(reply)

    def _leave(self, header: dict, tensors: list, shard: int) -> bytes:
        session = header.get("session")
        self.call(shard, "leave", (int(header["learner"]), bool(header["finished"]), session), CALL_S)
        self._gate(time.monotonic())
        return pack({})

    def _hold(self, header: dict, tensors: list, shard: int) -> bytes:
        self.call(shard, "hold_from", (int(header["learner"]), int(header["step"]), header.get("session")), CALL_S)
        self._gate(time.monotonic())
        return pack({})

    def _status(self, header: dict, tensors: list, shard: int) -> bytes:
        return pack(self.call(shard, "status", (), CALL_S))

    def _replicate(self, header: dict, tensors: list, shard: int) -> bytes:
        if self.replicator is None:
            raise RuntimeError(
                f"the syncer {self.name} keeps no standby: its actor runs on a Ray cluster (ray_address), whose "
                f"checkpoint files lie on another node; run the syncer on a local Ray instance to have a standby"
            )
        return self.replicator.serve(header)


def _epoch_of(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


__all__ = ["CALL_S", "Gateway", "SERVER_OPTIONS", "WAIT_REPLY_S", "ray_backend"]
