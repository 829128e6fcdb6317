"""The copy protocol of :mod:`diloco.decoupled.rpc.replicate` on its own, over a real gateway on loopback: the
checkpoint files of a sharded syncer (one folder a shard) written with :mod:`diloco.decoupled.checkpoint`'s own
functions, as the actor writes them; the gateway's backend is a stand-in that is never called (a copy does not go
through the syncer)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("grpc")

from diloco.decoupled.checkpoint import RECORDS, append_records, save_state, saved_states
from diloco.decoupled.rpc.client import Link
from diloco.decoupled.rpc.gateway import Gateway
from diloco.decoupled.rpc.replicate import Follower, Replicator, shard_dirs


def _backend(shard, method, args, timeout):
    raise AssertionError(f"a copy called the syncer ({method})")


def _write(d, merges: int, rows: list[dict]) -> None:
    append_records(d, rows)
    save_state(d, {"global": [torch.full((5,), float(merges))], "num_records": merges}, merges=merges)


def _same(a, b) -> None:
    """The newest state (what a takeover loads) byte for byte, and the records log."""
    newest, copied = saved_states(a)[-1], saved_states(b)[-1]
    assert newest.name == copied.name and newest.read_bytes() == copied.read_bytes()
    assert (a / RECORDS).read_bytes() == (b / RECORDS).read_bytes()


def test_each_shards_folder_is_copied_its_new_rows_appended_and_a_log_that_is_no_prefix_sent_whole(tmp_path):
    """Two shards: after each write the standby's folders equal the active's (the newest state byte for byte, the
    records log); a second copy sends only the new rows (fewer bytes than the first); and when the active's log
    is rewritten (a restarted actor drops rows whose state never reached its disk), the standby's log, no longer a
    prefix of it (its length and SHA-256 say so), is replaced whole, whether the new log is shorter or longer. A call with nothing new is answered ``unchanged``; a
    second standby is refused while the first is attached."""
    active, standby = tmp_path / "active", tmp_path / "standby"
    replicator = Replicator(active, num_shards=2, info={"epoch": 3, "name": "s"})
    gateway = Gateway((_backend, 2), name="s", token="t", host="127.0.0.1", port=0, epoch=3, replicator=replicator)
    gateway.start()
    follower = Follower(Link(f"s@127.0.0.1:{gateway.port}", token="t", retry_for=0.0), standby, standby="a")
    try:
        dirs = [d for _, d in shard_dirs(active, 2)]
        assert [d.name for d in dirs] == ["shard-0", "shard-1"]
        for n, d in enumerate(dirs):
            _write(d, 1, [{"fragment": n, "version": 1, "pad": "x" * 400}])
        assert follower.pull(timeout=5.0) and follower.epoch == 3 and follower.info == {"epoch": 3, "name": "s"}
        first = replicator.bytes_sent
        for d in dirs:
            _same(d, standby / d.name)
        assert not follower.pull(timeout=5.0)  # nothing new: "unchanged", after HOLD_S
        other = Follower(Link(f"s@127.0.0.1:{gateway.port}", token="t", retry_for=0.0), tmp_path / "other", standby="b")
        with pytest.raises(RuntimeError, match=r"has a standby already \(a\): one standby per active"):
            other.pull(timeout=5.0)
        other.link.close()

        for n, d in enumerate(dirs):
            _write(d, 2, [{"fragment": n, "version": 2}])
            _write(d, 3, [{"fragment": n, "version": 3}])
        assert follower.pull(timeout=5.0)
        for d in dirs:
            _same(d, standby / d.name)
        assert len(saved_states(standby / "shard-0")) == 2  # two kept, as the actor keeps them (the copies it got)
        assert replicator.bytes_sent - first < first  # the new rows only (the first copy held 400-byte rows)

        # rewritten shorter (a restarted actor drops rows whose state never reached its disk), then grows past the
        # standby's length with other rows: sent whole, both times
        (dirs[1] / RECORDS).write_text('{"fragment": 1, "version": 1}\n')
        _write(dirs[1], 4, [{"fragment": 1, "version": 2}])
        assert follower.pull(timeout=5.0)
        (dirs[0] / RECORDS).write_text('{"fragment": 0, "version": 1}\n')
        _write(dirs[0], 4, [{"fragment": 0, "version": 2, "pad": "y" * 900}])
        assert (dirs[0] / RECORDS).stat().st_size > (standby / "shard-0" / RECORDS).stat().st_size
        assert follower.pull(timeout=5.0)
        for d in dirs:
            _same(d, standby / d.name)
    finally:
        follower.link.close()
        gateway.stop()
