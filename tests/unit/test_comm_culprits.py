"""How a failed collective names the peers at fault (the pure part of TorchDistCommunicator's diagnosis)."""

from diloco.comm.torch_dist import name_culprits


def test_a_dead_peer_that_never_reached_the_collective_is_named_dead():
    parts = name_culprits(seq=5, last_entered={1: 5, 2: 4}, silent=[2], heartbeat=True)
    assert parts == [
        "rank(s) [2] never reached it (rank 2 last entered #4)",
        "rank(s) [2] stopped responding (heartbeat stopped: process dead or stopped)",
    ]


def test_a_peer_that_gave_up_on_the_same_fault_is_not_called_the_culprit():
    """M = 3, rank 2 dies; rank 1 meets it first, fails, exits; rank 0 then sees both silent."""
    parts = name_culprits(seq=5, last_entered={1: 5, 2: 4}, silent=[1, 2], heartbeat=True)
    assert "rank(s) [2] stopped responding (heartbeat stopped: process dead or stopped)" in parts
    assert any(p.startswith("rank(s) [1] entered it and then stopped responding") for p in parts)
    assert not any("[1, 2]" in p for p in parts)


def test_a_peer_killed_inside_the_collective_is_the_culprit_when_no_other_peer_is_behind():
    """M = 2, rank 1 is SIGKILLed after entering the collective: nobody else to blame (seen in CI)."""
    parts = name_culprits(seq=8, last_entered={1: 8}, silent=[1], heartbeat=True)
    assert parts == ["rank(s) [1] stopped responding (heartbeat stopped: process dead or stopped)"]


def test_a_live_peer_behind_is_called_hung_only_when_heartbeats_were_watched():
    hung = name_culprits(seq=3, last_entered={1: 2}, silent=[], heartbeat=True)
    assert hung[-1] == "their heartbeat is alive: hung or slower than the timeout"
    blind = name_culprits(seq=3, last_entered={1: 2}, silent=[], heartbeat=False)
    assert blind == ["rank(s) [1] never reached it (rank 1 last entered #2)"]


def test_every_peer_inside_and_alive_points_inside_the_collective():
    parts = name_culprits(
        seq=3, last_entered={0: 3, 2: 3}, silent=[], heartbeat=True, label=lambda r: f" (global rank {r + 4})"
    )
    assert parts == ["every peer had entered it and is alive: a peer failed inside the collective"]
    named = name_culprits(
        seq=3, last_entered={2: 1}, silent=[2], heartbeat=True, label=lambda r: f" (global rank {r + 4})"
    )
    assert named[0] == "rank(s) [2] never reached it (rank 2 (global rank 6) last entered #1)"
