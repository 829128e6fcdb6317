"""The active syncer's state, copied to a standby before a learner is told of it; the epoch that fences.

::

    # the active (``diloco syncer``): its gateway serves Replicate, and gates its answers on the standby's copy
    replicator = Replicator(out / "syncer", num_shards=S, info={...})
    gateway = Gateway(backend, name=..., token=..., epoch=E, replicator=replicator)
    # the standby (``diloco syncer --standby-of NAME@HOST:PORT --out DIR2``): pulls until the active is silent
    follower = Follower(Link(spec, token=token, retry_for=0.0), DIR2 / "syncer")
    follower.follow(takeover_s=10.0)     # returns when the active did not answer for takeover_s seconds

**What is copied**: the syncer actor's own checkpoint files (:mod:`diloco.decoupled.checkpoint`: the newest
``syncer-<merges>.pt``, which holds the syncer's state, the replies not yet taken and who finished, and the new rows
of ``records.jsonl``), byte for byte, into the standby's ``--out``/``syncer``. A standby that takes over starts its
actor from them as Ray restarts a killed one (the same code, the same files), so its parameters, outer optimizer,
versions and merge count are the active's, bit for bit. The actor writes them after every merge (and join and
leave) *before* any reply leaves it, so the copy is as complete as a restart's.

**Mode: synchronous, no merge lost.** While a standby is attached (it called within :data:`STANDBY_LOST_S`), every
answer that tells a learner of the syncer's state (a granted claim, a join's welcome, a merge's reply, a leave, a hold) is held by
the gateway until the standby acknowledged a copy taken after that state was written (:meth:`Replicator.gate`):
whatever a learner was told, the standby holds. A report the active took but did not merge yet is not copied
(its learner sends it again to the standby that took over: the reply's ``at_epoch`` tells it was lost). A standby
silent for ``STANDBY_LOST_S`` is let go (the active goes on alone, as with no standby, and says so); it catches up
with the newest state when it calls again. The cost: the whole state file per copy (the global parameters and
the outer optimizer's momentum in FP32, about 2 x 4 bytes a parameter, plus the replies held), one copy per
merge, and one round trip to the standby added to a merge's replies.

**Fencing**: the standby that takes over serves epoch + 1. Learners carry the newest epoch they have seen in every
call and ignore an answer of an older one (:func:`~diloco.decoupled.rpc.client.accept_epoch`); a gateway named a
newer epoch than its own stops answering (:class:`~diloco.decoupled.rpc.gateway.Gateway`), so a former active that
comes back merges no report of a learner that moved on. Not covered: a partition between the active and its standby
alone (both alive, the learners reaching both): the standby takes over after ``takeover_s`` and the active goes on
after ``STANDBY_LOST_S``, each with the learners that reach it, until those of the old epoch fail over; the docs
say so. One standby per active.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

from diloco.decoupled.checkpoint import RECORDS, saved_states
from diloco.decoupled.rpc.client import Unreachable
from diloco.decoupled.rpc.frames import pack, unpack
from diloco.files import atomic_write_bytes

#: Seconds the active waits on a silent standby before it goes on without it (answers are no longer held).
STANDBY_LOST_S = 10.0
#: Seconds a Replicate call is held at the active when nothing changed (the standby's heartbeat, in effect).
HOLD_S = 1.0
#: How often a held Replicate call looks at the checkpoint files (woken at once when an answer waits on it).
POLL_S = 0.02
#: Checkpoint files a standby keeps, as the actor does.
KEEP = 2


def shard_dirs(root: Path | str, num_shards: int) -> list[tuple[str, Path]]:
    """Each shard's checkpoint folder under ``root`` and its name relative to it (as :mod:`~diloco.decoupled.ray_shards`
    lays them out: ``root`` itself for one shard, ``shard-s`` for more)."""
    root = Path(root)
    if num_shards == 1:
        return [("", root)]
    return [(f"shard-{s}", root / f"shard-{s}") for s in range(num_shards)]


def _stats(dirs: list[tuple[str, Path]]) -> tuple:
    """What changes when the actor writes: each folder's newest state file and its records' length."""
    found = []
    for _, d in dirs:
        states = saved_states(d)
        newest = None
        if states:
            try:
                st = states[-1].stat()
                newest = (states[-1].name, st.st_ino, st.st_size, st.st_mtime_ns)
            except FileNotFoundError:
                newest = None
        try:
            records = (d / RECORDS).stat().st_size
        except FileNotFoundError:
            records = 0
        found.append((newest, records))
    return tuple(found)


class Replicator:
    """The active's side (module docstring): answers the standby's Replicate calls with the newest checkpoint
    files, and holds learners' answers (:meth:`gate`) until the standby acknowledged them. ``info``: what a standby
    needs to become this syncer (the config, the name, the epoch, ...), sent with its first copy."""

    def __init__(
        self, root: Path | str, *, num_shards: int = 1, info: dict[str, Any], lost_after_s: float = STANDBY_LOST_S
    ) -> None:
        self.dirs = shard_dirs(root, num_shards)
        self.info, self.lost_after_s = dict(info), lost_after_s
        self._cond = threading.Condition()
        self._seq = 0
        self._sent: dict[str, Any] | None = None  # the newest copy sent: seq, stats, stat_at
        self._acked_seq = -1
        self._acked_at = float("-inf")  # the standby holds every state written before this (monotonic)
        self._heard: float | None = None
        self.standby: str | None = None  # where the standby runs, as it says
        self.copies = 0
        self.bytes_sent = 0
        self.gated = self.gate_waits_s = 0.0
        self.let_go = 0  # times a standby went silent and answers went on without it

    def attached(self) -> bool:
        return self._heard is not None and time.monotonic() - self._heard < self.lost_after_s

    def gate(self, since: float) -> None:
        """Return once the standby holds the state written before ``since`` (monotonic), or at once when no standby
        is attached; a standby that goes silent meanwhile is let go after :data:`STANDBY_LOST_S`."""
        began = time.monotonic()
        with self._cond:
            self._cond.notify_all()  # a held Replicate call looks now
            while self._acked_at < since:
                if not self.attached():
                    if self._heard is not None:
                        self.let_go += 1
                        self._heard = None
                    break
                self._cond.wait(POLL_S)
            self.gated += 1
            self.gate_waits_s += time.monotonic() - began

    def serve(self, header: dict[str, Any]) -> bytes:
        """One Replicate call: the standby says which copy it holds (``have``: its seq, -1 for none; ``records``,
        ``records_sha``: the length and SHA-256 of each folder's records log); answered with a newer copy, or
        ``unchanged`` after :data:`HOLD_S`."""
        if not self.info:
            raise ConnectionError("the syncer is starting (no copy to give yet)")
        have = int(header.get("have", -1))
        end = time.monotonic() + HOLD_S
        who = str(header.get("standby", ""))
        with self._cond:
            if self.attached() and self.standby is not None and who != self.standby:
                raise RuntimeError(
                    f"this syncer has a standby already ({self.standby}): one standby per active; stop this one, or "
                    f"that one and start this one {self.lost_after_s:g} s later"
                )
            self._heard = time.monotonic()
            self.standby = who
            if self._sent is not None and have == self._sent["seq"] and have > self._acked_seq:
                self._acked_seq = have
                self._acked_at = max(self._acked_at, self._sent["stat_at"])
                self._cond.notify_all()
        while True:
            stat_at = time.monotonic()
            stats = _stats(self.dirs)
            with self._cond:
                same = self._sent is not None and have == self._sent["seq"] and stats == self._sent["stats"]
                if same:  # the standby holds what is on disk now
                    self._acked_at = max(self._acked_at, stat_at)
                    self._heard = time.monotonic()
                    self._cond.notify_all()
                    if time.monotonic() >= end:
                        return pack({"seq": have, "unchanged": True, "epoch": self.info.get("epoch", 0)})
                    self._cond.wait(POLL_S)
                    continue
            try:
                return self._copy(stats, stat_at, header)
            except FileNotFoundError:  # a file replaced while read: look again
                continue

    def _copy(self, stats: tuple, stat_at: float, header: dict[str, Any]) -> bytes:
        held, digests = list(header.get("records") or []), list(header.get("records_sha") or [])
        folders, tensors = [], []
        for i, (name, d) in enumerate(self.dirs):
            states = saved_states(d)
            state = states[-1].read_bytes() if states else b""
            path = d / RECORDS
            records = path.read_bytes() if path.exists() else b""
            records = records[: records.rfind(b"\n") + 1]  # whole rows only
            offset = int(held[i]) if i < len(held) else 0
            digest = digests[i] if i < len(digests) else None
            if offset > len(records) or hashlib.sha256(records[:offset]).hexdigest() != digest:
                offset = 0  # the standby's log is not a prefix of ours (ours was cut by a restart): sent whole
            folders.append({"dir": name, "state": states[-1].name if states else None, "records_from": offset})
            tensors += [_bytes(state), _bytes(records[offset:])]
        with self._cond:
            self._seq += 1
            self._sent = {"seq": self._seq, "stats": stats, "stat_at": stat_at}
            seq = self._seq
        head: dict[str, Any] = {"seq": seq, "unchanged": False, "dirs": folders, "epoch": self.info.get("epoch", 0)}
        if int(header.get("have", -1)) < 0:
            head["info"] = self.info
        frame = pack(head, tensors)
        self.copies += 1
        self.bytes_sent += len(frame)
        return frame

    def stats(self) -> dict[str, Any]:
        """For the summary: copies sent, their bytes, answers held and the seconds they waited in all."""
        return {
            "standby": self.standby,
            "copies": self.copies,
            "bytes_sent": self.bytes_sent,
            "answers_gated": int(self.gated),
            "gate_wait_s": round(self.gate_waits_s, 3),
            "standby_let_go": self.let_go,
        }


def replicator_for(cfg: Any, root: Path | str) -> Replicator | None:
    """The service's replicator of its syncer's checkpoint folder ``root`` (its ``info`` set once the service
    knows it), or None where the actor runs on a Ray cluster (``ray_address``): its files are then on another node,
    not this process's to copy, and a standby is refused saying so."""
    if cfg.ray_address:
        return None
    return Replicator(root, num_shards=cfg.syncer_shards, info={})


def _bytes(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def apply_copy(root: Path | str, header: dict[str, Any], tensors: list[torch.Tensor]) -> None:
    """Write a copy into the standby's checkpoint folder ``root``: each folder's new records rows, then its state
    file (atomic, the newest :data:`KEEP` kept), as the actor writes them."""
    root = Path(root)
    for i, folder in enumerate(header["dirs"]):
        d = root / folder["dir"] if folder["dir"] else root
        d.mkdir(parents=True, exist_ok=True)
        state, records = tensors[2 * i].numpy().tobytes(), tensors[2 * i + 1].numpy().tobytes()
        path = d / RECORDS
        start = int(folder["records_from"])
        if start == 0:
            atomic_write_bytes(path, records)
        elif records:
            with open(path, "r+b") as fh:
                fh.truncate(start)
                fh.seek(start)
                fh.write(records)
                fh.flush()
                os.fsync(fh.fileno())
        if folder["state"]:
            atomic_write_bytes(d / folder["state"], state)
            for old in saved_states(d)[:-KEEP]:
                old.unlink(missing_ok=True)


def records_held(root: Path | str, header_dirs: list[str]) -> tuple[list[int], list[str]]:
    """The length and SHA-256 of each folder's records log at the standby (the active sends the rows after it, or
    the whole log where the standby's is no prefix of its own)."""
    root = Path(root)
    sizes, digests = [], []
    for name in header_dirs:
        path = (root / name if name else root) / RECORDS
        data = path.read_bytes() if path.exists() else b""
        sizes.append(len(data))
        digests.append(hashlib.sha256(data).hexdigest())
    return sizes, digests


class Follower:
    """The standby's side (module docstring): pulls copies from the active over ``link`` (a
    :class:`~diloco.decoupled.rpc.client.Link` with ``retry_for=0``) into ``root`` until the active is silent."""

    def __init__(self, link: Any, root: Path | str, *, standby: str = "") -> None:
        self.link, self.root, self.standby = link, Path(root), standby
        self.seq = -1
        self.info: dict[str, Any] | None = None
        self.epoch = 0
        self.copies = 0
        self.bytes_received = 0
        self.heard_at = time.monotonic()
        self._dirs: list[str] = []

    def pull(self, timeout: float) -> bool:
        """One Replicate call; True when it brought a new copy (written before this returns)."""
        sizes, digests = records_held(self.root, self._dirs)
        request = {"have": self.seq, "records": sizes, "records_sha": digests, "standby": self.standby}
        answer = self.link.call("Replicate", request, timeout=timeout)
        self.heard_at = time.monotonic()
        header, tensors = unpack(answer)
        self.epoch = int(header.get("epoch", self.epoch))
        if header.get("unchanged"):
            return False
        apply_copy(self.root, header, tensors)
        self._dirs = [f["dir"] for f in header["dirs"]]
        if "info" in header:
            self.info = header["info"]
        self.seq = int(header["seq"])
        self.copies += 1
        self.bytes_received += len(answer)
        return True

    def follow(self, *, takeover_s: float, stop: threading.Event | None = None, on_copy=None) -> str:
        """Pull until the active has not answered for ``takeover_s`` seconds (returns why) or ``stop`` is set.
        A refusal that is no silence (a wrong token, another run's name) is raised."""
        last = ""
        while stop is None or not stop.is_set():
            try:
                if self.pull(timeout=max(HOLD_S + 1.0, takeover_s)) and on_copy is not None:
                    on_copy(self)
                continue
            except Unreachable as exc:  # silence (refused, reset, no answer in time, or a fenced active)
                last = str(exc)
            silent = time.monotonic() - self.heard_at
            if silent >= takeover_s:
                return f"the active syncer did not answer for {silent:.1f} s (last: {last[:300]})"
            time.sleep(0.2)
        return "stopped"


__all__ = [
    "HOLD_S",
    "KEEP",
    "POLL_S",
    "STANDBY_LOST_S",
    "Follower",
    "Replicator",
    "apply_copy",
    "records_held",
    "replicator_for",
    "shard_dirs",
]
