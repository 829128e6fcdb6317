"""Decoupled DiLoCo under failures, without Ray: a learner that joins again, reports sent twice, a syncer
restored from its checkpoint mid-run, the checkpoint files, and the fault schedule and log analysis."""

from __future__ import annotations

import pytest
import torch
from _tiny import make_model

from diloco.decoupled.chaos import Chaos, parse_kills
from diloco.decoupled.chaos_logs import goodput, rejoin_seconds, survivor_stalls
from diloco.decoupled.checkpoint import (
    RECORDS,
    append_records,
    load_latest_state,
    load_records,
    save_state,
    saved_states,
)
from diloco.decoupled.messages import Report
from diloco.decoupled.syncer import Syncer
from diloco.wire.registry import get_codec


def _report(syncer, m, p, theta, *, steps=4, base_version=None, codec="fp32"):
    """Learner m's report of fragment p with values ``theta`` (against the copy the syncer gave it)."""
    base = syncer._base[m][p]
    version = syncer._held[m][p] if base_version is None else base_version
    return Report(
        learner=m,
        fragment=p,
        payload=get_codec(codec).encode(base - theta),
        steps=steps,
        tokens=steps * 10.0,
        step_time=0.0,
        sent_after_step=steps,
        base_version=version,
    )


def _syncer(M=2, **kw):
    return Syncer(make_model(seed=0), num_learners=M, grace_gamma=0.0, **kw)


def test_a_learner_that_joins_again_gets_the_current_fragments_and_its_open_report_is_dropped():
    syncer = _syncer(M=2, quorum=2)
    for m in (0, 1):
        assert syncer.join(m).incarnation == 0
    theta = syncer._snapshot[0] + 0.5
    syncer.receive(_report(syncer, 0, 0, theta))
    assert syncer.expects(0, 0)
    again = syncer.join(0)  # learner 0 restarted: its open report goes, and that round no longer waits for it
    assert again.incarnation == 1 and not syncer.expects(0, 0) and again.versions == [0]
    assert torch.equal(again.fragments[0], syncer._snapshot[0])
    assert again.step == 0  # where the others are: none has reported (its old self does not count)
    replies = syncer.receive(_report(syncer, 1, 0, syncer._snapshot[0] - 1.0))
    assert [r.learner for r in replies] == [1] and syncer.records[-1].learners == (1,)
    # a round opened after the rejoin waits for both (K = 2); the new learner 0 did no work yet: weight 0
    syncer.receive(_report(syncer, 1, 0, syncer._snapshot[0] - 1.0))
    assert len(syncer.records) == 1
    replies = syncer.receive(_report(syncer, 0, 0, syncer._snapshot[0] + 1.0, steps=0))
    assert {r.learner for r in replies} == {0, 1} and syncer.records[-1].weights == (0.0, 1.0)


def test_with_k_equal_m_a_restarted_learner_falls_in_step_and_nobody_deadlocks():
    """M = K = 2, two fragments. Learner 0 reports fragment 1 after step 8 and must have the reply to go on;
    learner 1 dies before reporting it and comes back. Its new life starts at step 8 (the others' phase),
    the fragment-1 round merges without it, and the next rounds have both learners' reports."""
    from diloco.decoupled.learner import Learner
    from diloco.decoupled.local import LocalTransport

    syncer = _syncer(M=2, quorum=2, num_fragments=2, overlap_steps=1)
    with LocalTransport(syncer, timeout=20) as transport:
        a = Learner(
            make_model(seed=1), channel=transport.channel(0), learner=0, sync_every=8, num_fragments=2, overlap_steps=1
        )
        b = Learner(
            make_model(seed=2), channel=transport.channel(1), learner=1, sync_every=8, num_fragments=2, overlap_steps=1
        )
        for _ in range(5):  # both report the first fragment after step 4 and apply the reply after step 5
            for learner in (a, b):
                learner.after_optimizer_step(tokens=1)
        for _ in range(3):  # only learner 0 reaches step 8 (and reports); learner 1 is killed at step 7
            a.after_optimizer_step(tokens=1)
        b.after_optimizer_step(tokens=1)
        b.after_optimizer_step(tokens=1)
        b2 = Learner(
            make_model(seed=3), channel=transport.channel(1), learner=1, sync_every=8, num_fragments=2, overlap_steps=1
        )  # the restart
        assert b2.step_count == 8 and b2.incarnation == 1
        for _ in range(8):  # without the alignment learner 0 would wait forever at step 9
            for learner in (a, b2):
                learner.after_optimizer_step(tokens=1)
        a.close()
        b2.close()
    rounds = [(r.fragment, r.learners) for r in syncer.records]
    assert rounds[:3] == [(0, (0, 1)), (1, (0,)), (0, (0, 1))] and rounds[3] == (1, (0, 1))


def test_a_report_sent_twice_or_after_it_was_merged_is_ignored():
    syncer = _syncer(M=2, quorum=1)
    for m in (0, 1):
        syncer.join(m)
    report = _report(syncer, 0, 0, syncer._snapshot[0] + 0.25)
    replies = syncer.receive(report)
    assert len(replies) == 1 and syncer.versions == [1]
    before = syncer.global_flat[0].detach().clone()
    assert syncer.receive(report) == [] and syncer.ignored_reports == 1  # a retry of a merged report
    assert syncer.versions == [1] and torch.equal(syncer.global_flat[0].detach(), before)
    syncer_two = _syncer(M=2, quorum=2)
    for m in (0, 1):
        syncer_two.join(m)
    twice = _report(syncer_two, 0, 0, syncer_two._snapshot[0] + 0.1)
    syncer_two.receive(twice)
    syncer_two.receive(twice)  # the same report again while its round is open
    assert syncer_two.ignored_reports == 1 and not syncer_two.records


@pytest.mark.parametrize("codec", ["fp32", "fp4_e3m0"])
def test_a_syncer_restored_from_its_state_mid_run_continues_exactly(codec):
    """Two syncers see the same reports; one is rebuilt from the other's state_dict halfway (its learners
    behind on some fragments, a lossy codec's per-learner copies too): both end with the same bits."""
    kw = dict(M=3, quorum=2, num_fragments=2, codec=codec)
    a = _syncer(**kw)
    for m in range(3):
        a.join(m)
    gen = torch.Generator().manual_seed(0)

    def feed(s, rounds):
        for step in rounds:
            for m in ((0, 1), (1, 2), (2, 0))[step % 3]:
                for p in range(2):
                    noise = torch.randn(s._snapshot[p].shape, generator=gen) * 0.01
                    s.receive(_report(s, m, p, s._base[m][p] + noise, steps=4 + step, codec=codec))

    torch.manual_seed(0)
    feed(a, range(3))
    state = a.state_dict()
    b = _syncer(**kw)
    b.load_state_dict(state)
    gen_state = gen.get_state()
    feed(a, range(3, 6))
    gen.set_state(gen_state)
    feed(b, range(3, 6))
    assert a.versions == b.versions and len(a.records) == len(b.records) == 12
    for ga, gb in zip(a.global_flat, b.global_flat, strict=True):
        assert torch.equal(ga, gb)


def test_checkpoint_files_are_atomic_keep_k_and_a_damaged_newest_falls_back(tmp_path, capsys):
    syncer = _syncer(M=1, quorum=1)
    syncer.join(0)
    for _ in range(4):
        syncer.receive(_report(syncer, 0, 0, syncer._snapshot[0] + 0.1))
        save_state(tmp_path, {"syncer": syncer.state_dict()}, merges=len(syncer.records), keep=2)
    assert [p.name for p in saved_states(tmp_path)] == ["syncer-00000003.pt", "syncer-00000004.pt"]
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".pt"]  # no temporary file left behind
    saved_states(tmp_path)[-1].write_bytes(b"torn")
    state = load_latest_state(tmp_path)
    assert "does not load" in capsys.readouterr().err
    restored = _syncer(M=1, quorum=1)
    restored.load_state_dict(state["syncer"])
    assert restored.versions == [3]
    with pytest.raises(ValueError, match="keep=0"):
        save_state(tmp_path, {}, merges=9, keep=0)
    assert load_latest_state(tmp_path / "none") is None


def _checkpoint_as_the_actor_does(syncer, directory, written: int) -> int:
    """SyncerActor._save's order: the new records to the log, then the state that counts them."""
    append_records(directory, [r.as_row() for r in syncer.records[written:]])
    save_state(directory, {"syncer": syncer.state_dict(records=False)}, merges=len(syncer.records), keep=2)
    return len(syncer.records)


def test_checkpoints_stay_one_size_however_many_merges_and_the_records_come_back_from_their_log(tmp_path):
    syncer, written, sizes = _syncer(M=1, quorum=1), 0, {}
    syncer.join(0)
    for i in range(1, 41):
        syncer.receive(_report(syncer, 0, 0, syncer._snapshot[0] + 0.01 * i))
        written = _checkpoint_as_the_actor_does(syncer, tmp_path, written)
        sizes[i] = saved_states(tmp_path)[-1].stat().st_size
    # a state holding its records grows with every merge; these do not (the file names' digits aside)
    assert abs(sizes[40] - sizes[5]) <= 16, sizes
    assert len((tmp_path / RECORDS).read_text().splitlines()) == 40
    state = load_latest_state(tmp_path)
    restored = _syncer(M=1, quorum=1)
    restored.load_state_dict(state["syncer"], records=load_records(tmp_path, state["syncer"]["num_records"]))
    assert restored.records == syncer.records and restored.versions == syncer.versions == [40]
    with pytest.raises(ValueError, match="40 merge records apart"):
        _syncer(M=1, quorum=1).load_state_dict(state["syncer"])


def test_records_of_merges_whose_state_never_landed_are_dropped_and_a_short_log_is_refused(tmp_path):
    syncer, written = _syncer(M=1, quorum=1), 0
    syncer.join(0)
    for _ in range(3):
        syncer.receive(_report(syncer, 0, 0, syncer._snapshot[0] + 0.1))
        written = _checkpoint_as_the_actor_does(syncer, tmp_path, written)
    # a fourth merge reached the log but the syncer died before its state was written, mid-way through a fifth row
    syncer.receive(_report(syncer, 0, 0, syncer._snapshot[0] + 0.1))
    append_records(tmp_path, [syncer.records[-1].as_row()])
    with open(tmp_path / RECORDS, "a") as fh:
        fh.write('{"fragment": 0, "vers')
    rows = load_records(tmp_path, load_latest_state(tmp_path)["syncer"]["num_records"])
    assert [r["version"] for r in rows] == [1, 2, 3]
    assert (tmp_path / RECORDS).read_text().count("\n") == 3 and (tmp_path / RECORDS).read_text().endswith("}\n")
    with pytest.raises(RuntimeError, match="holds 3 merge records but the syncer's newest state holds 5"):
        load_records(tmp_path, 5)


def test_learner_counts_its_versions_so_a_restarted_syncer_can_tell_a_repeat():
    from diloco.decoupled.learner import Learner
    from diloco.decoupled.local import LocalTransport

    syncer = _syncer(M=1, quorum=1)
    model = make_model(seed=1)
    with LocalTransport(syncer) as transport:
        algo = Learner(model, channel=transport.channel(0), learner=0, sync_every=2)
        for _ in range(4):
            algo.after_optimizer_step(tokens=1)
        algo.close()
    assert algo.versions == syncer.versions == [2] and syncer.ignored_reports == 0


# -- the fault schedule and the analysis ---------------------------------------------------------------------------
def test_chaos_events_fixed_and_poisson_and_bad_settings():
    chaos = Chaos(kills=((3, 1),), syncer_kills=(5.0,), kill_rate=6.0, downtime_s=1.0, seed=1)
    events = chaos.events(num_learners=3, duration_s=60)
    assert events == sorted(events, key=lambda e: e.at) and all(e.at < 60 for e in events)
    assert (3.0, "learner", 1) in [(e.at, e.target, e.index) for e in events]
    assert [e.at for e in events if e.target == "syncer"] == [5.0]
    n = len([e for e in events if e.target == "learner"]) - 1
    assert 10 <= n <= 40  # 6 per learner-minute, 3 learners, a minute (downtime between kills): ~15-18
    assert events == chaos.events(num_learners=3, duration_s=60)  # seeded
    assert parse_kills("3:1, 12.5:0") == ((3.0, 1), (12.5, 0))
    with pytest.raises(ValueError, match="SECONDS:LEARNER"):
        parse_kills("3")
    with pytest.raises(ValueError, match="one factor >= 1 per learner"):
        Chaos(slowdown=(1.0, 3.0)).check(3)
    with pytest.raises(ValueError, match="learner in 0..2"):
        Chaos(kills=((1.0, 3),)).check(3)


def _rows(m, inc, t0, n, dt, synced_every=4, start=0):
    rows = [{"learner": m, "incarnation": inc, "event": "joined", "t": t0}]
    for i in range(1, n + 1):
        rows.append(
            {
                "learner": m,
                "incarnation": inc,
                "step": start + i,
                "t": t0 + i * dt,
                "dt": dt,
                "compute_s": dt,
                "synced": [0] if i % synced_every == 0 else [],
            }
        )
    return rows


def test_stalls_rejoin_and_goodput_from_the_logs():
    # learner 0 steady at 0.1 s; learner 1 killed at t=10 (after 11 steps in its first life: steps 9-11
    # never reached the syncer), restarted, joined at t=12 and in a merge with weight > 0 at t=12.9
    rows = _rows(0, 0, 0.0, 200, 0.1) + _rows(1, 0, 0.0, 11, 0.1 - 1e-9) + _rows(1, 1, 12.0, 80, 0.1)
    rows[50]["dt"] = 0.25  # one slow survivor step after the kill (t = 5.0 is before it: not counted)
    slow_after = next(r for r in rows if r["learner"] == 0 and r.get("step") == 105)
    slow_after["dt"] = 0.15
    merges = [
        {"at": 12.5, "learners": [0, 1], "weights": [1.0, 0.0]},
        {"at": 12.9, "learners": [0, 1], "weights": [0.6, 0.4]},
    ]
    (stall,) = survivor_stalls(rows, kill_at=10.0, killed=1, window_s=5.0)
    assert (
        stall.learner == 0
        and stall.worst_step_ratio == pytest.approx(1.5)
        and stall.steps_kept == pytest.approx(1.0, abs=0.05)
    )
    assert rejoin_seconds(rows, merges, learner=1, incarnation=1) == pytest.approx(0.9)
    assert rejoin_seconds(rows, merges, learner=1, incarnation=2) is None
    g = goodput(rows, num_learners=2, wall_s=20.0)
    assert g.lost_steps == 3
    assert g.useful_s == pytest.approx(200 * 0.1 + 8 * (0.1 - 1e-9) + 80 * 0.1)
    assert g.value == pytest.approx(g.useful_s / 40.0)


def test_each_learners_waiting_share_from_its_step_rows():
    from diloco.decoupled.chaos_logs import summarize, wait_shares

    rows = _rows(0, 0, 0.0, 16, 0.1) + _rows(1, 0, 0.0, 16, 0.1) + _rows(1, 1, 5.0, 4, 0.2)
    for r in rows:
        if r.get("step") == 16 and r["learner"] == 0:
            r["dt"], r["wait_s"] = 0.7, 0.6  # a step that waited 0.6 s for its reply
    assert wait_shares(rows, num_learners=3) == [pytest.approx(0.6 / 2.2), pytest.approx(0.0), None]
    assert summarize(rows, [], [], num_learners=2, wall_s=5.0)["wait_share"] == [pytest.approx(0.6 / 2.2), 0.0]
    # a syncer killed at t = 0.85: every learner is a survivor; learner 0's step 16 (0.7 s, 7 x typical) is after it
    kill = {"target": "syncer", "at": 0.85, "back_at": 1.5, "merges_before": 3, "restored_merges": 3}
    (row,) = summarize(rows, [], [kill], num_learners=2, wall_s=5.0, window_s=1.0)["syncer_kills"]
    assert row["worst_step_ratio"] == pytest.approx(7.0) and row["restored_merges"] == 3


def test_a_learner_log_cut_mid_line_by_a_kill_still_reads(tmp_path):
    from diloco.decoupled.chaos_logs import read_learner_log

    log = tmp_path / "learner-0.jsonl"
    log.write_text('{"learner": 0, "step": 1}\n{"learner": 0, "st\n{"learner": 0, "step": 1, "incarnation": 1}\n')
    assert read_learner_log(log) == [{"learner": 0, "step": 1}, {"learner": 0, "step": 1, "incarnation": 1}]
    assert read_learner_log(tmp_path / "none.jsonl") == []


@pytest.mark.parametrize("outer_gradient", ["global", "own"])
def test_a_stale_learners_outer_gradient_against_theta_or_against_its_own_copy(outer_gradient):
    """Outer SGD lr 1, no momentum, K = 1, every merge a whole step. Learner 0 moves Theta by 0.5; then learner 1, still holding the
    old copy b, reports b - d. 'global': Delta = Theta - (b - d), so Theta becomes learner 1's values b - d
    (learner 0's progress undone); 'own': Delta = b - (b - d) = d, so Theta moves by d from where it is."""
    syncer = Syncer(
        make_model(seed=0),
        num_learners=2,
        quorum=1,
        grace_gamma=0.0,
        merge="mean",
        outer_gradient=outer_gradient,
        outer_scale="none",
        outer_optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
    )
    for m in (0, 1):
        syncer.join(m)
    b = syncer._snapshot[0].clone()
    syncer.receive(_report(syncer, 0, 0, b + 0.5))
    theta_1 = syncer._snapshot[0].clone()
    assert torch.allclose(theta_1, b + 0.5)
    d = torch.full_like(b, 0.25)
    syncer.receive(_report(syncer, 1, 0, b - d))
    expected = b - d if outer_gradient == "global" else theta_1 - d
    assert torch.allclose(syncer._snapshot[0], expected, atol=1e-6)
    with pytest.raises(ValueError, match="outer_gradient='both'"):
        Syncer(make_model(), num_learners=2, outer_gradient="both")


def test_outer_scale_share_makes_a_merge_of_k_of_m_learners_a_k_over_m_share_of_an_outer_step():
    syncer = Syncer(
        make_model(seed=0),
        num_learners=2,
        quorum=1,
        grace_gamma=0.0,
        merge="mean",
        outer_scale="share",
        outer_optimizer=lambda p: torch.optim.SGD(p, lr=1.0),
    )
    for m in (0, 1):
        syncer.join(m)
    b = syncer._snapshot[0].clone()
    syncer.receive(_report(syncer, 0, 0, b + 0.5))  # one of two members merged: half an outer step
    assert torch.allclose(syncer._snapshot[0], b + 0.25)


def test_learners_holding_at_a_checkpoint_release_a_round_of_earlier_steps_only():
    """K = 2 of 3: learner 0's report after step 8 waits alone for a second one. Learners 1 and 2 holding at a
    checkpoint after step 8 (they sent theirs already) release it; a report after step 12 (past their
    checkpoint) waits for them again, and a restored syncer expects every member to join again as at first."""
    syncer = _syncer(M=3, quorum=2)
    for m in range(3):
        syncer.join(m)
    assert syncer.receive(_report(syncer, 0, 0, syncer._snapshot[0] + 0.5, steps=8)) == []
    assert syncer.hold(1, 8) == [] and syncer.expects(0, 0)  # learner 2 may still report after step 8
    replies = syncer.hold(2, 8)
    assert [r.learner for r in replies] == [0] and syncer.records[-1].learners == (0,)
    assert syncer.receive(_report(syncer, 0, 0, syncer._snapshot[0] + 0.5, steps=12)) == []
    assert syncer.expects(0, 0)  # after step 12: learners 1 and 2 hold at 8 and will report again

    restored = _syncer(M=3, quorum=2)
    restored.load_state_dict(syncer.state_dict())
    restored.expect_rejoins()
    restored.join(0)
    restored.receive(_report(restored, 0, 0, restored._snapshot[0] + 0.5, steps=16))
    restored.join(1)  # joins again after the round opened: still waited for (a resumed run's learners start together)
    assert restored._rounds[0].excused == set()  # (a learner's join again mid-run excuses it: see the test above)
    assert restored.join(2).incarnation == 1 and restored._rounds[0].excused == set()
