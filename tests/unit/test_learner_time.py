"""Where a learner's step time goes (its log's ``compute_s``, ``wait_s``, ``blocked_s``, ``other_s``, ``cpu_s``): a
stall has a name. A syncer that is slow to take a report shows as time blocked in calls to it, a reply that is late as
waiting, and neither as compute."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import torch
from _tiny import batches, make_model

from diloco.decoupled.learner import Learner
from diloco.decoupled.local import LocalTransport
from diloco.decoupled.syncer import Syncer
from diloco.decoupled.trainer import LearnerLog

SEND_S = 0.05  # each report sits this long in the channel's send, as on a link to a syncer that is restarting


class SlowSends:
    """A channel whose ``send`` takes ``SEND_S`` longer (everything else passed through)."""

    def __init__(self, channel):
        self.inner, self.sends = channel, 0

    def send(self, report):
        self.sends += 1
        time.sleep(SEND_S)
        return self.inner.send(report)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_time_blocked_in_calls_to_the_syncer_is_logged_apart_from_compute_and_waiting(tmp_path):
    steps = 16
    syncer = Syncer(make_model(seed=0), num_learners=1, num_fragments=2, overlap_steps=1)
    with LocalTransport(syncer, timeout=60) as transport:
        channel = SlowSends(transport.channel(0))
        model = make_model(seed=1)
        algo = Learner(model, channel=channel, learner=0, sync_every=4, num_fragments=2, overlap_steps=1)
        log = LearnerLog(tmp_path, 0, append=False)
        log.start(algo, 0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for step, (x, y) in enumerate(batches(0, steps), start=1):
            t0 = time.monotonic()
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
            compute = time.monotonic() - t0
            reports = algo.after_optimizer_step(tokens=x.numel())
            out = SimpleNamespace(
                step_time=time.monotonic() - t0,
                compute_time=compute,
                loss=0.0,
                tokens=x.numel(),
                synced_fragments=[r.fragment for r in reports],
            )
            log.add(algo, step, out)
        algo.close()
        log.close()
    rows = [json.loads(line) for line in (tmp_path / "learner-0.jsonl").read_text().splitlines()][1:]
    assert len(rows) == steps and channel.sends >= steps // 4 * 2 - 2
    blocked = sum(r["blocked_s"] for r in rows)
    assert blocked >= channel.sends * SEND_S * 0.99  # every slow send is counted as blocked ...
    assert blocked < channel.sends * SEND_S + 0.5  # ... and little else (polls of a local syncer are instant)
    for r in rows:  # ... none of it as compute or waiting: the parts add up to (at most) the step
        assert r["other_s"] >= 0 and r["compute_s"] + r["wait_s"] + r["blocked_s"] <= r["dt"] + 1e-6
        assert r["cpu_s"] >= 0
    slow = [r for r in rows if r["blocked_s"] >= SEND_S]
    assert slow and all(r["dt"] >= r["blocked_s"] for r in slow)
    assert sum(r["cpu_s"] for r in rows) > 0  # the process' CPU time of its compute
