"""What the status monitor reads from the syncer's files (:mod:`diloco.decoupled.status.files`): the global
parameters of a syncer's checkpoint cut back into the model's parameters are the syncer's own, bit for bit (what the
loss plot evaluates); a tail returns whole rows only, each once."""

from __future__ import annotations

import json

import torch
from _tiny import make_model

from diloco.algorithm.fragments import split_fragments
from diloco.decoupled.checkpoint import save_state
from diloco.decoupled.messages import Report
from diloco.decoupled.status.files import Tail, checkpoint_age_s, global_parameters
from diloco.decoupled.syncer import Syncer
from diloco.wire.registry import get_codec


def test_the_checkpoint_holds_the_syncers_global_parameters(tmp_path):
    model = make_model(seed=0)
    syncer = Syncer(make_model(seed=0), num_learners=2, quorum=2, num_fragments=2, codec="fp32", guard="off")
    for m in (0, 1):
        syncer.join(m)
    for p in range(2):  # one merge of each fragment, of moved values
        for m in (0, 1):
            payload = get_codec("fp32").encode(torch.randn(syncer.fragment_sizes()[p]) * 0.01)
            report = Report(
                learner=m, fragment=p, payload=payload, steps=4, tokens=64.0, step_time=0.1, sent_after_step=4
            )
            syncer.receive(report)
    assert len(syncer.records) == 2
    assert checkpoint_age_s([tmp_path]) is None and global_parameters([tmp_path], []) is None
    save_state(tmp_path, {"syncer": syncer.state_dict(records=False)}, merges=len(syncer.records))
    got = global_parameters([tmp_path], split_fragments(model, 2))
    want = syncer.global_named_parameters()
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert not all(torch.equal(got[k], p) for k, p in model.named_parameters())  # the merges moved them
    assert 0.0 <= checkpoint_age_s([tmp_path]) < 60.0


def test_a_tail_reads_whole_rows_once(tmp_path):
    path = tmp_path / "events.jsonl"
    tail = Tail(path)
    assert tail.read() == []  # not written yet
    path.write_text(json.dumps({"a": 1}) + "\n" + '{"b": ')
    assert tail.read() == [{"a": 1}]
    with open(path, "a") as fh:
        fh.write('2}\n{"c": 3}\n')
    assert tail.read() == [{"b": 2}, {"c": 3}] and tail.read() == []
