"""A syncer restarted from its folder names the job holding a learner's index to a job that lost it, as its
predecessor did (:func:`diloco.decoupled.membership.holders_from_events`: the ``hello`` rows of ``events.jsonl``
whose session still holds the index)."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("ray")

from _tiny import make_model

from diloco.decoupled.membership import holders_from_events
from diloco.decoupled.ray_transport import SyncerActor
from diloco.decoupled.syncer import Syncer


def test_the_hello_of_the_session_holding_the_index_names_its_host(tmp_path):
    rows = [
        {"event": "hello", "learner": 0, "session": "a", "host": "site-a pid 1"},
        {"event": "hello", "learner": 0, "session": "b", "host": "site-b pid 2"},  # took the index after a
        {"event": "refused", "learner": 1, "session": "c", "host": "site-c pid 3"},  # not a hello
        {"event": "hello", "learner": 1, "session": "d"},  # no host given
    ]
    text = "".join(json.dumps(r) + "\n" for r in rows) + '{"event": "hello", "sess'  # a row cut short by a crash
    (tmp_path / "events.jsonl").write_text(text)
    claims = {0: ("b", 0.0), 1: ("d", 0.0), 2: ("e", 0.0)}
    assert holders_from_events(str(tmp_path), claims) == {0: "site-b pid 2"}
    assert holders_from_events(str(tmp_path / "none"), claims) == {}  # no events: nobody named
    assert holders_from_events(None, claims) == {}


def test_a_restarted_syncer_names_the_holder_to_a_job_that_lost_the_index(tmp_path):
    def actor() -> SyncerActor:
        syncer = Syncer(make_model(seed=0), num_learners=2, quorum=1, num_fragments=1, overlap_steps=1, codec="fp32")
        return SyncerActor(syncer, str(tmp_path))

    first = actor()
    assert asyncio.run(first.hello(0, "new", host="site-b pid 2")) is None  # granted, saved before it is told
    refusal = first.claim_refusal(0, "old")
    assert "site-b pid 2" in refusal
    restarted = actor()  # from the folder: the claims and, now, who holds them
    assert restarted.claim_refusal(0, "old") == refusal
    assert restarted.claim_refusal(0, "new") is None and restarted.claim_refusal(1, "old") is None
