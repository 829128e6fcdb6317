"""The Ray transport: the syncer as a named async actor; learners find it by name.

::

    handle = start_syncer(Syncer(model, num_learners=3, quorum=1, overlap_steps=2))   # ray.init() if needed
    # in each learner (a thread, a Ray task or actor, another process attached to the same cluster):
    channel = connect(learner=m)                       # diloco.decoupled.ray_channel: the actor looked up by name
    algo = Learner(model, channel=channel, learner=m, sync_every=8, overlap_steps=2)
    ...
    records = ray.get(handle.records.remote())

``ray.init()`` starts a local Ray instance by default; ``address=`` joins a running cluster. Nothing here
turns Ray's token authentication off: with ``RAY_AUTH_MODE=token`` in the environment (Ray's setting),
a local instance generates its token and every call carries it.

The actor runs :class:`~diloco.decoupled.syncer.Syncer` unchanged on its event loop (one thread, so
the syncer needs no lock): a report is taken at once, a reply waits on an ``asyncio.Condition``, and a
one-shot timer merges a round when its grace window ends. Requires the optional ``ray`` extra
(``pip install -e .[ray]``); nothing in :mod:`diloco.algorithm` imports Ray.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from typing import Any

import ray
import torch

from diloco.decoupled.lease_actor import LeaseLog
from diloco.decoupled.membership import HEARTBEAT_S, LEASE_S, claims_state, holders_from_events, restore_claims
from diloco.decoupled.messages import MergeRecord, Reply, Report, Welcome
from diloco.decoupled.ray_address import PROBE_TIMEOUT_S, check_address
from diloco.decoupled.ray_start import start_ray
from diloco.decoupled.syncer import Syncer
from diloco.errors import ConfigError

#: The actor's default name and namespace: learners look it up by these.
DEFAULT_NAME = "diloco-syncer"
DEFAULT_NAMESPACE = "diloco"
_KEEP_ALIVE: list[Any] = []  # object refs restartable actors are rebuilt from
#: How long a syncer waits for a report whose reply is asked for before it has come (see wait_reply).
RESEND_AFTER_S = 30.0


class SyncerActor(LeaseLog):
    """A :class:`Syncer` behind Ray: join, report, wait_reply, leave (see the module docstring); the learner jobs'
    claims on their indices (hello, heartbeat, status) are :class:`~diloco.decoupled.membership.Membership`'s; the
    learner lease's heartbeats and events (``learner_lease``) :class:`~diloco.decoupled.lease_actor.LeaseLog`'s.

    With ``checkpoint_dir``, every merge is saved there (atomic, the newest ``keep`` kept) before its
    replies are handed out, and the actor is started with unlimited restarts: a restarted actor loads the
    newest state and the calls that were in flight are retried on it by Ray, so a syncer that dies loses
    only the time it was down (reports still in open rounds are sent again by their learners).
    """

    def __init__(
        self,
        syncer: Syncer | Callable[[], Syncer],
        checkpoint_dir: str | None = None,
        keep: int = 2,
        fingerprint: dict[str, Any] | None = None,
    ) -> None:
        if callable(syncer):  # built here (a detached actor must not depend on its starter's object store)
            syncer = syncer()
        self.syncer = syncer
        # membership of learners that connect with a session (see hello): who holds each index, who finished
        self.fingerprint = fingerprint
        self._claims: dict[int, tuple[str, float]] = {}  # learner -> (session, monotonic time last heard from)
        self._finished: set[int] = set()
        self.checkpoint_dir, self.keep = checkpoint_dir, keep
        self._replies: dict[tuple[int, int], Reply] = {}
        self._cond: asyncio.Condition | None = None
        self._timer: asyncio.Task | None = None
        self.restored_merges: int | None = None  # merges in the checkpoint this incarnation started from
        self._seen: set[tuple[int, int]] = set()  # (learner, fragment) reported to this incarnation
        self.started_at = time.time()
        self._records_written = 0  # merge records already in checkpoint_dir's record log
        if checkpoint_dir is not None:
            from diloco.decoupled.checkpoint import load_latest_state, load_records

            os.makedirs(checkpoint_dir, exist_ok=True)

            state = load_latest_state(checkpoint_dir)
            if state is not None:
                saved = state["syncer"]
                syncer.load_state_dict(
                    saved, records=None if "records" in saved else load_records(checkpoint_dir, saved["num_records"])
                )
                self._records_written = len(syncer.records)
                self._replies = {(int(r["learner"]), int(r["fragment"])): Reply(**r) for r in state["replies"]}
                self._finished = {int(m) for m in state.get("finished", [])}
                self._claims = restore_claims(state.get("claims"), time.monotonic())  # a fresh lease from now
                self._holders = holders_from_events(checkpoint_dir, self._claims)  # named to a job that lost one
                self.restored_merges = len(syncer.records)
                self._lease_logged = len(syncer.lease.events)  # written by its predecessor
            self._log(
                "started",
                restored_merges=self.restored_merges,
                pid=os.getpid(),
                learner_lease=syncer.lease.setting or "auto",
            )
        _warm_up()

    def _log(self, event: str, **fields: Any) -> None:
        """One row in ``checkpoint_dir/events.jsonl`` (what the syncer saw, for the record of a faulty run)."""
        if self.checkpoint_dir is not None:
            with open(os.path.join(self.checkpoint_dir, "events.jsonl"), "a") as fh:
                fh.write(json.dumps({"t": time.time(), "event": event, **fields}) + "\n")

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:  # created on the actor's event loop
            self._cond = asyncio.Condition()
        return self._cond

    def _save(self) -> None:
        from diloco.decoupled.checkpoint import append_records, save_state

        # the new merge records first (appended to the record log), then the state that counts them
        append_records(self.checkpoint_dir, [r.as_row() for r in self.syncer.records[self._records_written :]])
        self._records_written = len(self.syncer.records)
        replies = [
            dict(learner=r.learner, fragment=r.fragment, payload=r.payload, version=r.version, trained=r.trained)
            for r in self._replies.values()
        ]
        save_state(
            self.checkpoint_dir,
            {
                "syncer": self.syncer.state_dict(records=False),
                "replies": replies,
                "finished": sorted(self._finished),
                "claims": claims_state(self._claims),
            },
            merges=len(self.syncer.records),
            keep=self.keep,
        )

    async def _deliver(self, replies: list[Reply]) -> None:
        self._log_lease()  # the learner lease's leaves and joins (before the merges they let through)
        if replies:
            # no await between taking the replies and saving: no call sees a reply that is not on disk
            for r in replies:
                self._replies[(r.learner, r.fragment)] = r
            if self.checkpoint_dir is not None:
                self._save()
                rec = self.syncer.records[-1]
                self._log("merged", fragment=rec.fragment, version=rec.version, learners=list(rec.learners))
            async with self._condition():
                self._condition().notify_all()
        self._arm()

    def _arm(self) -> None:
        """A one-shot timer for the earliest open grace window."""
        deadline = self.syncer.next_deadline()
        if self._timer is not None and not self._timer.done():
            self._timer.cancel()
        if deadline is not None:
            self._timer = asyncio.get_running_loop().create_task(self._tick(deadline))

    async def _tick(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - self.syncer.clock()))
        self._timer = None
        await self._deliver(self.syncer.poll())

    async def join(self, learner: int) -> Welcome:
        for key in [k for k in self._replies if k[0] == learner]:  # a restarted learner starts afresh
            del self._replies[key]
        welcome = self.syncer.join(learner)
        self._seen -= {k for k in self._seen if k[0] == learner}
        if self.checkpoint_dir is not None:  # a restarted syncer must know what this learner holds
            self._save()
        self._log("joined", learner=learner, incarnation=welcome.incarnation)
        await self._deliver(self.syncer.poll())
        return welcome

    async def report(self, report: Report) -> None:
        ignored = self.syncer.ignored_reports
        versions = self.syncer.versions
        stale = versions[report.fragment] - report.base_version if 0 <= report.fragment < len(versions) else None
        self._seen.add((report.learner, report.fragment))
        replies = self.syncer.receive(report)
        self._log(
            "report",
            learner=report.learner,
            fragment=report.fragment,
            base_version=report.base_version,
            ignored=self.syncer.ignored_reports > ignored,
            step=report.sent_after_step,
            steps=report.steps,
            tokens=report.tokens,
            step_time=report.step_time,
            staleness=stale,
        )
        await self._deliver(replies)
        async with self._condition():  # a wait_reply that came first looks again
            self._condition().notify_all()

    async def wait_reply(
        self, learner: int, fragment: int, sent_at: float = 0.0, base_version: int = -1
    ) -> Reply | None:
        """The reply to ``learner``'s report of ``fragment`` (sent at wall time ``sent_at``, made against version
        ``base_version``); None if this syncer does not hold that report and will not: the learner then sends it
        again.

        Ray does not keep the order of calls to an async actor, so this call may come before its report; it
        waits for it, unless the report was sent before this syncer started (a restarted syncer: the report
        went down with its predecessor) or has not come within ``RESEND_AFTER_S`` (a clock between machines
        off by more than that). A reply of a version the learner already holds (at most ``base_version``) is one
        it took (before this syncer restarted, or in an earlier round): it answers an older report and is dropped.
        A reply is kept after it is given, until then: a learner whose answer was lost on the way (a partition
        while it was sent) asks again and gets it, instead of a report the syncer merged already being ignored."""
        key = (learner, fragment)
        lost = sent_at < self.started_at

        def answered() -> bool:
            if key in self._replies and self._replies[key].version <= base_version:
                del self._replies[key]  # taken already, before a restart
            if key in self._replies:
                return True
            return lost if key not in self._seen else not self.syncer.expects(learner, fragment)

        async with self._condition():
            try:
                await asyncio.wait_for(self._condition().wait_for(answered), timeout=RESEND_AFTER_S)
            except TimeoutError:
                pass
            # kept, not taken: an answer lost on its way (a link cut while it was sent) is asked for again and
            # given again; it goes once the learner's next wait shows it holds it (base_version, above)
            reply = self._replies.get(key)
            self._seen.discard(key)
        if reply is None:
            self._log("no report to answer", learner=learner, fragment=fragment)
        return reply

    async def pid(self) -> int:
        return os.getpid()

    async def restored(self) -> int | None:
        return self.restored_merges

    async def leave(self, learner: int, finished: bool = False, session: str | None = None) -> None:
        """``learner`` stops; ``finished``: after its last step (it cannot join again and no longer counts).
        A leave from a ``session`` that no longer holds the index (a job that was replaced) changes nothing."""
        if not self._release(learner, session):
            return
        if finished:
            self._finished.add(learner)
        self._log("left", learner=learner, finished=finished)
        replies = self.syncer.leave(learner)
        if self.checkpoint_dir is not None and not replies:
            self._save()
        await self._deliver(replies)

    async def hold(self, learner: int, step: int) -> None:
        await self._deliver(self.syncer.hold(learner, step))

    async def records(self) -> list[MergeRecord]:
        return list(self.syncer.records)

    async def learner_steps(self) -> dict[int, int]:
        """Each learner's latest step its reports were sent after (what the syncer counts as trained)."""
        return dict(self.syncer.reached)

    async def global_named_parameters(self) -> dict[str, torch.Tensor]:
        return self.syncer.global_named_parameters()

    async def state_dict(self) -> dict[str, Any]:
        return self.syncer.state_dict()


#: The Ray actor of :class:`SyncerActor`, the plain class (which tests and benchmarks run on a loop of their own).
RaySyncerActor = ray.remote(SyncerActor)


def _warm_up() -> None:
    """One outer step, merge and checkpoint write on throwaway tensors: the first ones in a fresh process load
    lazily imported code (about a second here), which would otherwise land in the first merge's sync time and,
    through its moving average, close the grace window for many rounds."""
    import io

    from diloco.decoupled.merge import merge_outer_gradients

    p = torch.zeros(8, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True)
    p.grad = merge_outer_gradients(
        [torch.ones(8), torch.ones(8)], [0.5, 0.5], sizes=[8], embedding=[False], merge="rda"
    )
    opt.step()
    torch.save({"p": p.detach()}, io.BytesIO())


def init(*, address: str | None = None, namespace: str = DEFAULT_NAMESPACE) -> None:
    """``ray.init`` once: a local instance (``address=None``) or the cluster at ``address`` (probed first:
    :func:`check_address`). Joining a cluster with token authentication needs ``RAY_AUTH_MODE=token`` in the
    environment and the cluster's token where Ray reads it (Ray never sends a token to an address given
    explicitly otherwise); a refused connection is a ConfigError saying so."""
    if not ray.is_initialized():
        check_address(address)
        try:
            start_ray(address, namespace=namespace)  # a local start: Ray's start-up timeouts retried
        except ConnectionError as exc:
            if not address:
                raise
            raise ConfigError(
                f"the Ray cluster at {address} did not let this process in ({exc}): with token authentication "
                f"(on by default for a new Ray instance) run this process with RAY_AUTH_MODE=token in its "
                f"environment and the cluster's token in ~/.ray/auth_token or RAY_AUTH_TOKEN (currently "
                f"RAY_AUTH_MODE={os.environ.get('RAY_AUTH_MODE', '(unset)')})"
            ) from None


def start_syncer(
    syncer: Syncer | Callable[[], Syncer],
    *,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    address: str | None = None,
    checkpoint_dir: str | None = None,
    keep: int = 2,
    detached: bool = False,
    fingerprint: dict[str, Any] | None = None,
    num_gpus: float | None = None,
) -> Any:
    """Start ``syncer`` as the named actor ``name`` (Ray started first if it is not); returns its handle.

    ``checkpoint_dir``: save every merge there and restart the actor from it if it dies (without it a
    dead syncer is not restarted: its state would be lost). ``syncer`` may be a picklable function that builds
    it (in the actor's process). ``detached``: the actor outlives this process (Ray's ``lifetime="detached"``:
    stop it with ``ray.kill``); needs ``checkpoint_dir`` and a function for ``syncer``, so that a restart
    depends on nothing this process holds. ``fingerprint``: the config keys learners must match
    (:meth:`SyncerActor.hello`). ``num_gpus``: Ray's GPUs for the actor (default: 1 for a syncer whose ``device`` is a
    GPU, else 0; give 1 for a function building one)."""
    if num_gpus is None:
        num_gpus = 1 if getattr(getattr(syncer, "device", None), "type", "cpu") == "cuda" else 0
    if detached and (checkpoint_dir is None or not callable(syncer)):
        raise ConfigError(
            "detached=True needs checkpoint_dir= and a function that builds the syncer (syncer=partial(...)): "
            "a detached actor is restarted without the process that started it"
        )
    init(address=address, namespace=namespace)
    try:
        ray.get_actor(name, namespace=namespace)
    except ValueError:
        pass
    else:
        raise ConfigError(
            f"a syncer named {name!r} already runs in namespace {namespace!r}: give another name= "
            f"or stop it first (ray.kill(ray.get_actor({name!r}, namespace={namespace!r})))"
        )
    if checkpoint_dir is None:
        return RaySyncerActor.options(name=name, namespace=namespace, num_gpus=num_gpus).remote(
            syncer, None, keep, fingerprint
        )
    options: dict[str, Any] = dict(
        name=name, namespace=namespace, max_restarts=-1, max_task_retries=-1, num_gpus=num_gpus
    )
    if detached:
        return RaySyncerActor.options(lifetime="detached", **options).remote(
            syncer, str(checkpoint_dir), keep, fingerprint
        )
    # a restarted actor is built again from its constructor's arguments: keep the initial syncer in the object
    # store for as long as this process runs (Ray frees an argument it passed inline once the actor is up)
    initial = ray.put(syncer)
    _KEEP_ALIVE.append(initial)
    return RaySyncerActor.options(**options).remote(initial, str(checkpoint_dir), keep, fingerprint)


__all__ = ["DEFAULT_NAME", "PROBE_TIMEOUT_S", "HEARTBEAT_S", "LEASE_S", "DEFAULT_NAMESPACE", "RESEND_AFTER_S"]
__all__ += ["RaySyncerActor", "SyncerActor", "check_address", "init", "start_syncer"]
