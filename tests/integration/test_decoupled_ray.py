"""Decoupled DiLoCo on a real local Ray instance: the syncer a named async actor, learners that find it
by name. Skipped when Ray is not installed (it is the optional ``ray`` extra)."""

from __future__ import annotations

import math
import statistics
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from _tiny import batches, make_model  # noqa: E402

from diloco.decoupled.learner import Learner  # noqa: E402
from diloco.decoupled.local import LocalTransport, run_learners  # noqa: E402
from diloco.decoupled.syncer import Syncer  # noqa: E402

pytestmark = pytest.mark.timeout(120)

M, STEPS = 3, 12
KW = dict(sync_every=4, num_fragments=2, overlap_steps=1, codec="fp32")


def _train(channel, m, **kw):
    model = make_model(seed=10 + m)
    algo = Learner(model, channel=channel, learner=m, **(KW | kw))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for x, y in batches(m, STEPS):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
        algo.after_optimizer_step(tokens=x.numel())
    algo.close()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _syncer(**kw):
    return Syncer(make_model(seed=0), num_learners=M, num_fragments=2, overlap_steps=1, codec="fp32", **kw)


def test_ray_syncer_actor_gives_the_in_process_bits_and_learners_find_it_by_name(local_ray):
    """K = M, mean, fp32, no grace window: every round merges the same reports in learner order, so the
    Ray actor and the in-process syncer thread end with the same bits."""
    import threading

    from diloco.decoupled.ray_channel import connect
    from diloco.decoupled.ray_transport import start_syncer

    with LocalTransport(_syncer(merge="mean", grace_gamma=0.0)) as transport:
        local = run_learners(_train, transport)
    expected = transport.syncer.global_named_parameters()

    handle = start_syncer(_syncer(merge="mean", grace_gamma=0.0), name="syncer-eq", namespace="diloco-test")
    results: list = [None] * M
    errors: list = []

    def learner(m):
        try:  # each learner looks the actor up by its name
            results[m] = _train(connect(learner=m, name="syncer-eq", namespace="diloco-test"), m)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=learner, args=(m,)) for m in range(M)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    got = ray.get(handle.global_named_parameters.remote())
    records = ray.get(handle.records.remote())
    ray.kill(handle)
    assert records and all(len(r.learners) == M for r in records)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name
    for mine, theirs in zip(results, local):
        assert all(torch.equal(mine[n], theirs[n]) for n in mine)


def test_ray_quorum_one_with_a_grace_window_merges(local_ray):
    """K = 1, and the learner overwrites tau steps after it sees each reply (polled without waiting)."""
    from diloco.decoupled.ray_channel import connect
    from diloco.decoupled.ray_transport import start_syncer

    handle = start_syncer(_syncer(quorum=1, grace_gamma=0.5), name="syncer-k1", namespace="diloco-test")
    out = _train(connect(learner=0, name="syncer-k1", namespace="diloco-test"), 0, overwrite_after="arrival")
    records = ray.get(handle.records.remote())
    ray.kill(handle)
    assert records and all(r.learners == (0,) for r in records)
    assert all(torch.isfinite(v).all() for v in out.values())


def test_token_authentication_is_on_unless_the_environment_turns_it_off(local_ray):
    """Nothing in the library sets RAY_AUTH_MODE: a new local instance keeps Ray's default, token auth on."""
    import os

    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        pytest.skip("RAY_AUTH_MODE turns token authentication off in this environment")
    assert is_token_auth_enabled()


def test_a_second_syncer_of_the_same_name_and_a_missing_one_are_refused(local_ray):
    from diloco.decoupled.ray_channel import connect
    from diloco.decoupled.ray_transport import start_syncer

    handle = start_syncer(_syncer(), name="syncer-dup", namespace="diloco-test")
    ray.get(handle.records.remote())  # the actor is up
    with pytest.raises(ValueError, match="already runs"):
        start_syncer(_syncer(), name="syncer-dup", namespace="diloco-test")
    ray.kill(handle)
    with pytest.raises(ValueError, match="no syncer named 'nobody'"):
        connect(learner=0, name="nobody", namespace="diloco-test")


def test_a_finished_learner_is_refused_and_no_longer_counts_toward_the_quorum(local_ray):
    """At the actor (what the syncer service runs): M = 2, K = 2. Learner 1 trains 8 steps and finishes; learner 0
    trains 16: its reports after learner 1 left merge alone (no quorum of 2 waited for), and learner 1 joining again
    is refused, saying it finished."""
    import threading

    from diloco.decoupled.ray_channel import connect
    from diloco.decoupled.ray_transport import start_syncer
    from diloco.errors import ConfigError

    syncer = Syncer(make_model(seed=0), num_learners=2, quorum=2, num_fragments=2, overlap_steps=1, codec="fp32")
    handle = start_syncer(syncer, name="syncer-finish", namespace="diloco-test")
    errors: list = []

    def learner(m, steps):
        try:  # each claims its index (a session, as a site job does); close() leaves saying it finished
            channel = connect(learner=m, name="syncer-finish", namespace="diloco-test", fingerprint={})
            model = make_model(seed=10 + m)
            algo = Learner(model, channel=channel, learner=m, **KW)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            for x, y in batches(m, steps):
                model(x, y)[1].backward()
                opt.step()
                opt.zero_grad()
                algo.after_optimizer_step(tokens=x.numel())
            algo.finish()
        except BaseException as exc:
            errors.append((m, exc))

    threads = [threading.Thread(target=learner, args=(m, steps)) for m, steps in ((0, 16), (1, 8))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors, errors
    with pytest.raises(ConfigError, match="learner 1 has finished this run"):
        connect(learner=1, name="syncer-finish", namespace="diloco-test", fingerprint={})
    records = ray.get(handle.records.remote())
    ray.kill(handle)
    together = [r for r in records if r.learners == (0, 1)]
    alone = [r for r in records if r.learners == (0,)]
    assert len(together) + len(alone) == len(records) and together and len(alone) >= 2
    assert records[-len(alone) :] == alone  # after learner 1 left, learner 0 merges alone


def test_a_job_whose_report_was_refused_for_a_lost_claim_stops_at_once_on_a_ray_channel(local_ray):
    """Job B holds learner 0's index; job A's session no longer does (its claim lapsed and B took the index: A's
    channel is built here with that session, so the test need not wait out a lease). A's report is refused, and A's
    wait for its reply raises ClaimLost naming the index as soon as the refusal is back, before A's next heartbeat
    (stopped here) would say so. Before, the actor waited RESEND_AFTER_S (30 s) for a report it had refused, and A
    sent it again each time."""
    from diloco.decoupled.claim_lost import ClaimLost
    from diloco.decoupled.ray_channel import RayChannel, connect
    from diloco.decoupled.ray_transport import RESEND_AFTER_S, start_syncer

    syncer = Syncer(make_model(seed=0), num_learners=1, quorum=1, num_fragments=1, overlap_steps=1, codec="fp32")
    handle = start_syncer(syncer, name="syncer-lost-ray", namespace="diloco-test")
    b = connect(learner=0, name="syncer-lost-ray", namespace="diloco-test", fingerprint={})
    a = RayChannel(handle, 0, session="a-job-whose-claim-lapsed")
    model = make_model(seed=1)
    algo = Learner(model, channel=a, learner=0, sync_every=4, num_fragments=1, overlap_steps=1, codec="fp32")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    began = time.monotonic()
    with pytest.raises(ClaimLost, match="learner 0's index is no longer this job's"):
        for x, y in batches(0, 5):  # step 4 sends the report; step 5 waits for its reply
            model(x, y)[1].backward()
            opt.step()
            opt.zero_grad()
            algo.after_optimizer_step(tokens=x.numel())
    assert time.monotonic() - began < RESEND_AFTER_S / 2
    with pytest.raises(ClaimLost):  # and nothing more is sent
        a.send(a._sent[0])
    assert ray.get(handle.records.remote()) == []  # A's report was not merged
    b.leave()
    ray.kill(handle)


def _chaos_cfg(**kw):
    from diloco.train.config import TrainConfig, load_preset

    base = {**load_preset("tiny")["base"], "method": "decoupled", "threads": 1}
    return TrainConfig.from_dict({**base, **kw})


@pytest.mark.slow  # ~20 s on 2 cores: a 13 s schedule, three learner processes started and one restarted
def test_chaos_a_learner_killed_rejoins_and_a_killed_syncer_shard_holds_up_only_its_fragment_and_loses_nothing(
    local_ray, tmp_path, token_cache
):
    """Three learner processes (Ray actors, each running the trainer as a site job) on real text, quorum 1, steps
    padded to 0.2 s (an accelerator's step: the CPU is free meanwhile), the syncer as S = 2 shard actors (one per
    fragment) and learners riding out late replies. SIGKILL learner 1 at 3 s: the other two never wait for it (no
    step of theirs lasts as long as its restart took), Ray restarts it and it contributes again (weight > 0).
    SIGKILL the syncer at 7 s (its first kill: shard 0, fragment 0): while Ray restarts the shard, fragment 1
    (shard 1) goes on merging; shard 0 comes back from its checkpoint with every merge it had made and both
    fragments' versions run 1, 2, 3, ... with none skipped or repeated. The run stops on events, not on the clock:
    once the restarted learner has contributed and shard 0 has merged again (120 s is only a deadline; on an idle
    machine it stops near 10 s). How fast these happen (a survivor's worst step <= 2x typical, a rejoin within
    seconds) is measured by ``benchmarks/chaos.py``, where a loaded machine cannot fail the suite."""
    from diloco.decoupled.chaos import Chaos
    from diloco.decoupled.chaos_logs import goodput, kept_steps, rejoin_seconds, survivor_stalls
    from diloco.decoupled.ray_learners import run_on_ray

    cfg = _chaos_cfg(
        replicas=3,
        global_batch=12,
        sync_every=8,
        num_fragments=2,
        syncer_shards=2,
        overlap_steps=2,
        quorum=1,
        ride_out_steps=64,
        step_time=0.2,
        steps=1000,  # stopped by the events below long before
        eval_every=1000,
    )

    def rejoined_and_shard_0_merged_again(rows, merges, faults) -> bool:
        back = faults[-1]["back_at"]
        return rejoin_seconds(rows, merges, learner=1, incarnation=1) is not None and any(
            m["fragment"] == 0 and m["at"] > back for m in merges
        )

    chaos = Chaos(kills=((3.0, 1),), syncer_kills=(7.0,))
    result = run_on_ray(
        cfg,
        out_dir=tmp_path / "run",
        cache_dir=token_cache,
        chaos=chaos,
        max_seconds=120.0,
        stop_when=rejoined_and_shard_0_merged_again,
    )
    learner_kill, syncer_kill = result.faults
    assert {r["learner"]: r["incarnation"] for r in result.learners} == {0: 0, 1: 1, 2: 0}
    assert all(0 < r["steps"] < 1000 for r in result.learners)  # stopped by the event, each flushed and left
    assert result.wall_s < 120.0  # the event, not the deadline

    joined = [r for r in result.rows if r.get("event") == "joined" and r["learner"] == 1]
    restart_s = joined[1]["t"] - learner_kill["at"]  # kill to the new process' join: what a waiting survivor waits
    stalls = survivor_stalls(result.rows, kill_at=learner_kill["at"], killed=1, window_s=3.0, until=syncer_kill["at"])
    assert {s.learner for s in stalls} == {0, 2}
    for s in stalls:  # a survivor that waited for learner 1 would have one step spanning (most of) its restart
        typical = statistics.median(
            r["dt"] for r in result.rows if r.get("learner") == s.learner and "dt" in r and r["t"] < s.kill_at
        )
        assert s.worst_step_ratio * typical < restart_s, (stalls, restart_s)
    assert rejoin_seconds(result.rows, result.merges, learner=1, incarnation=1) is not None
    # the restart took no checkpoint (a decoupled learner writes one at its end only): it started again at step 1
    assert [(r["incarnation"], r["start_step"]) for r in joined] == [(0, 0), (1, 0)]
    assert joined[1]["pid"] != joined[0]["pid"] == learner_kill["pid"]
    # the steps of the killed process that reached the syncer are kept, the rest counted lost
    kept, lost = kept_steps(result.rows)
    assert len(kept) + lost == sum(1 for r in result.rows if "step" in r) and lost < len(kept)

    assert syncer_kill["shard"] == 0 and syncer_kill["restored_merges"] >= syncer_kill["merges_before"] > 0
    # fragment 0 waited for its shard's restart, and went on from the version it was restored at; fragment 1 did not
    after = {p: [m for m in result.merges if m["fragment"] == p and m["at"] > syncer_kill["killed_at"]] for p in (0, 1)}
    assert after[0][0]["version"] == syncer_kill["restored_merges"] + 1
    assert after[1][0]["at"] < after[0][0]["at"] and after[1][0]["at"] < syncer_kill["back_at"], (after, syncer_kill)
    for p in (0, 1):
        versions = [m["version"] for m in result.merges if m["fragment"] == p]
        assert versions == list(range(1, len(versions) + 1))  # none lost, none repeated
    assert any(m["fragment"] == 0 and m["at"] > syncer_kill["back_at"] for m in result.merges)  # shard 0 merges again
    assert all(torch.isfinite(v).all() for v in result.global_parameters.values())
    g = goodput(result.rows, num_learners=3, wall_s=result.wall_s)
    assert 0.3 < g.value <= 1.0, g
    # the summary a user reads (`diloco chaos` prints it): each kill, as carried out
    (summary_kill,) = result.summary["learner_kills"]
    assert summary_kill["learner"] == 1 and summary_kill["restart_s"] > 0
    (summary_syncer,) = result.summary["syncer_kills"]
    assert summary_syncer["restored_merges"] == syncer_kill["restored_merges"] and summary_syncer["down_s"] > 0
    for name in ("merges.jsonl", "chaos.json", "summary.json", "learner-1/learner-1.jsonl", "learner-1/metrics.jsonl"):
        assert (tmp_path / "run" / name).exists(), name
    assert (tmp_path / "run" / "syncer" / "shard-1").is_dir() and (tmp_path / "run" / "syncer-0.pid").exists()


def test_each_chaos_learner_is_given_the_whole_config():
    """Each learner process is given the whole config (a setting such as inner_optimizer=muon reaches it: what a
    site job does with Muon is test_site_jobs's Muon run)."""
    from diloco.decoupled.chaos import Chaos
    from diloco.decoupled.ray_learners import learner_configs

    kw = dict(replicas=2, sync_every=4, num_fragments=2, overlap_steps=1, quorum=0, merge="mean", grace_gamma=0.0)
    muon = _chaos_cfg(**kw, inner_optimizer="muon", inner_lr=0.02, steps=7)
    sites = learner_configs(muon, chaos=Chaos(), name="s", address="127.0.0.1:1")
    assert [c.pop("learner") for c in sites] == [0, 1] and [c.pop("syncer") for c in sites] == ["s@ray:127.0.0.1:1"] * 2
    given = {k: v for k, v in muon.to_dict().items() if k not in ("learner", "syncer")}
    assert sites == [given] * 2 and given["inner_optimizer"] == "muon"  # every other setting, as given


@pytest.mark.slow  # ~8 s on 2 cores: a chaos run of 12 steps (two learner processes start) and its threads run
def test_diloco_chaos_on_the_command_line_gives_the_threads_runs_bits(local_ray, tmp_path, token_cache, capsys):
    """`diloco chaos`: the config's learners as Ray processes; the schedule of kills given on the command line
    (here due after the run's end: the kills themselves and the summary's account of them are the kill/rejoin
    test's, which runs the same run_on_ray), the summary and files a user reads. K = M, mean merge, no grace
    window, equal speeds, no faults (learner 0's reports through the corrupting channel scaled by 1, exact in
    FP32): every round merges the same reports in learner order, so chaos's learners (Ray processes running the
    trainer) end with the syncer parameters of `diloco train --method decoupled` on the config they were given,
    hence its final loss to the bit."""
    import json

    from diloco.cli import main as cli_main
    from diloco.train.config import TrainConfig
    from diloco.train.trainer import train_model

    out = tmp_path / "chaos"
    sets = dict(replicas=2, steps=12, quorum=0, merge="mean", grace_gamma=0.0, overlap_steps=1, num_fragments=2)
    sets |= dict(sync_every=4, warmup_steps=3, codec="fp32", eval_every=12)
    code = cli_main(
        ["chaos", "--preset", "tiny", *(x for k, v in sets.items() for x in ("--set", f"{k}={v}"))]
        + ["--kill", "600:1", "--syncer-kill", "600", "--step-time", "0.05", "--out", str(out)]
        + ["--cache-dir", str(token_cache), "--corrupt", "0:0:1:1000"]
    )  # learner 0's reports through the corrupting channel, scaled by 1
    assert code == 0
    printed = capsys.readouterr().out  # Ray's raylet may print its own lines to stdout before the summary
    summary = json.loads(printed[0 if printed.startswith("{") else printed.index("\n{\n") + 1 :])
    assert summary == json.loads((out / "summary.json").read_text())
    assert math.isfinite(summary["eval_loss"]) and 0 < summary["goodput"] <= 1
    assert summary["learner_kills"] == [] and summary["syncer_kills"] == []  # none fell due before the end
    chaos = json.loads((out / "chaos.json").read_text())["chaos"]
    assert chaos["kills"] == [[600.0, 1]] and chaos["syncer_kills"] == [600.0]  # the flags reached the schedule
    # the corrupting channel carried every report of learner 0 (x 1: honest, so the guard let them all in)
    assert summary["corrupted_reports"] >= 12 // 4 and summary["guard_events"] == []
    for name in (
        "config.json",
        "merges.jsonl",
        "chaos.json",
        "learner-0/learner-0.jsonl",
        "learner-1/learner-1.jsonl",
        "learner-1/summary.json",
        "syncer/events.jsonl",
    ):
        assert (out / name).exists(), name
    assert json.loads((out / "config.json").read_text())["method"] == "decoupled"
    site = json.loads((out / "learner-1" / "config.json").read_text())
    assert site["learner"] == 1 and site["syncer"].startswith("diloco-syncer-") and site["step_time"] == 0.05
    # each learner trained the config's 12 steps, every one kept
    from diloco.decoupled.chaos_logs import kept_steps, learner_log_path, read_learner_log

    for m in (0, 1):
        rows = read_learner_log(learner_log_path(out, m))
        assert [r["step"] for r in rows if "step" in r] == list(range(1, 13))
        assert kept_steps(rows) == ([r for r in rows if "step" in r], 0)
    # the same bits as the threads run of the config the learners were given
    given = {k: v for k, v in site.items() if k not in ("learner", "syncer")}
    threads = train_model(TrainConfig.from_dict(given), tmp_path / "threads", cache_dir=token_cache, progress=False)
    assert summary["eval_loss"] == threads.final_eval_loss, (summary["eval_loss"], threads.final_eval_loss)
    assert len((out / "merges.jsonl").read_text().splitlines()) == len(
        (tmp_path / "threads" / "merges.jsonl").read_text().splitlines()
    )


def test_diloco_train_decoupled_on_ray_resumes_from_a_checkpoint_bit_identical(local_ray, tmp_path, token_cache):
    """`diloco train`'s learners (threads) against the syncer as a Ray actor on the running local instance. The
    syncer's state of a checkpoint is read from the actor (``state_dict``) and a resume restores it before the
    learners join: with K = M the resumed run ends where the uninterrupted one does. (K = 1 through the trainer
    on Ray: the chaos tests' site jobs.)"""
    import json

    from _hooks import CrashAfter, SimulatedCrash

    from diloco.train.config import TrainConfig, load_preset
    from diloco.train.trainer import Trainer, train_model

    base = {**load_preset("tiny")["base"], "method": "decoupled", "decoupled_transport": "ray", "merge": "mean"}
    cfg = TrainConfig.from_dict({**base, "overlap_steps": 1, "num_fragments": 2, "steps": 16, "checkpoint_every": 8})
    full = train_model(cfg, tmp_path / "full", cache_dir=token_cache, progress=False)
    # the cut run's syncer is built in its actor (syncer_device=auto: what a GPU syncer does, on the CPU here) and
    # restored there from the checkpoint's state (diloco.decoupled.ray_syncers); the full run's is sent built
    auto = TrainConfig.from_dict({**cfg.to_dict(), "syncer_device": "auto"})
    with pytest.raises(SimulatedCrash):
        Trainer(
            auto, tmp_path / "cut", cache_dir=token_cache, progress=False, callbacks=[CrashAfter(12, replicas=2)]
        ).run()
    resumed = Trainer(auto, tmp_path / "cut", cache_dir=token_cache, progress=False).run(resume=True)
    assert math.isfinite(full.final_eval_loss) and resumed.final_eval_loss == full.final_eval_loss
    rows = [(tmp_path / run / "merges.jsonl").read_text().splitlines() for run in ("full", "cut")]
    assert len(rows[0]) == len(rows[1]) > 0
    assert [json.loads(r)["learners"] for r in rows[0]] == [json.loads(r)["learners"] for r in rows[1]]
    assert {m for r in rows[0] for m in json.loads(r)["learners"]} == {0, 1}  # both learners' reports merged


def test_a_reply_whose_answer_was_lost_is_given_again_until_the_learner_holds_it(local_ray):
    """A learner's wait for a reply whose answer never reached it (a link cut while it was sent: what the 30 s
    partition across hosts in tests/hosts/test_deploy_partition.py did) asks again: the actor gives the same reply
    again, instead of nothing (its report, merged already, would then be ignored on every resend, and the learner
    would stop). Once the learner's next report of the fragment is made against that version, it is dropped."""
    from diloco.decoupled.messages import Report
    from diloco.decoupled.ray_transport import start_syncer
    from diloco.wire.registry import get_codec

    syncer = Syncer(make_model(seed=0), num_learners=1, quorum=1, num_fragments=2, codec="fp32", grace_gamma=0.0)
    handle = start_syncer(syncer, name="syncer-lost-reply", namespace="diloco-test")
    try:
        welcome = ray.get(handle.join.remote(0))
        numel = welcome.fragments[0].numel()

        def report(version: int) -> Report:
            payload = get_codec("fp32").encode(torch.full((numel,), 1e-3))
            return Report(0, 0, payload, 4, 64.0, 0.1, sent_after_step=4, base_version=version)

        ray.get(handle.report.remote(report(0)))
        first = ray.get(handle.wait_reply.remote(0, 0, time.time(), 0))
        again = ray.get(handle.wait_reply.remote(0, 0, time.time(), 0))  # the first answer was lost on the way
        assert first is not None and again is not None
        assert first.version == again.version == 1 and torch.equal(first.payload, again.payload)
        ray.get(handle.report.remote(report(1)))
        assert ray.get(handle.wait_reply.remote(0, 0, time.time(), 1)).version == 2  # the new one, not the kept one
    finally:
        ray.kill(handle)
