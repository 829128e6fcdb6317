"""Decoupled DiLoCo deployed as site jobs, under faults (:mod:`diloco.decoupled.site_faults`): the syncer service
(``diloco syncer``) and two site jobs (site 0 a torchrun job of 2 gloo ranks sharding one model with FSDP, site 1
a torchrun job of one rank), every one a real process on loopback, each site running the command the service printed (over gRPC, no Ray at the site). While
both sites train, this process joins the service as a learner would and is refused (a wrong token, another config,
an index out of range, a live learner's index). Learner 1's rank is SIGKILLed mid-run
and torchrun's agent restarts its job, which resumes from its checkpoint; then the syncer's process is SIGKILLed and
Ray restarts it from its checkpoint; at the end ``diloco export`` reads the service's folder. Skipped without Ray.
(The service's quick refusals and a finished learner at the syncer actor: test_syncer_service.py and
test_decoupled_ray.py.)"""

from __future__ import annotations

import json
import math
import queue
import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from diloco.cli._common import load_preset  # noqa: E402
from diloco.cli.syncer import service_config  # noqa: E402
from diloco.decoupled.service import connect_learner  # noqa: E402
from diloco.decoupled.site_faults import DEFAULT_SETS, Site, run_sites  # noqa: E402
from diloco.errors import ConfigError  # noqa: E402


def _cfg(**extra):
    return service_config(load_preset("tiny"), {**DEFAULT_SETS, **extra})


def _refused_while_both_train(info: dict, monkeypatch) -> None:
    """This process joins the live service as a site's learner does (over gRPC, with the token the printed commands
    carry; no Ray here) and is refused: a wrong token, a learner of another config (each differing key named), an
    index out of range, and learner 0's index while learner 0 trains (after waiting its claim's lease out)."""
    from diloco.decoupled.rpc.client import Link
    from diloco.decoupled.rpc.frames import unpack

    line = info["learners"][1]  # the whole command: the token, torchrun's restarts, --resume auto
    assert line.startswith(f"DILOCO_SYNCER_TOKEN={info['token']} torchrun --standalone --nproc-per-node ")
    assert " --max-restarts 3 " in line
    assert line.endswith(f"--set learner=1 --set syncer={info['syncer']} --out syncer-learner-1 --resume auto")
    monkeypatch.setenv("DILOCO_SYNCER_TOKEN", info["token"])
    link = Link(info["syncer"])
    end = time.monotonic() + 180
    while unpack(link.call("Status", {"shard": 0}))[0]["live"] != [0, 1]:  # (the actor may not be up yet)
        assert time.monotonic() < end, "the syncer actor and both learners were never live"
        time.sleep(0.2)
    link.close()
    with pytest.raises(ConfigError, match="refused a call with a wrong token"):
        connect_learner(_cfg(), learner=0, syncer=info["syncer"], token="wrong")
    with pytest.raises(ConfigError, match=r"sync_every: the learner has 4, the syncer 8.*outer_lr"):
        connect_learner(_cfg(sync_every=4, outer_lr=0.5), learner=0, syncer=info["syncer"])
    with pytest.raises(ConfigError, match=r"learner=2 is out of range.*0\.\.1"):
        connect_learner(_cfg(), learner=2, syncer=info["syncer"])
    start = time.monotonic()
    with pytest.raises(ConfigError, match="learner 0 is taken"):  # learner 0 trains on: its claim never lapses
        connect_learner(_cfg(), learner=0, syncer=info["syncer"])
    assert 4.0 <= time.monotonic() - start < 60.0  # it waited the lease out first (and then was refused, not hung)


@pytest.mark.slow  # ~45 s on 2 cores: a Ray instance, 4 learner processes, a job restart and a syncer restart
@pytest.mark.timeout(600)
def test_site_jobs_ride_out_a_killed_rank_and_a_killed_syncer(tmp_path, token_cache, monkeypatch):
    """K = 1: learner 0 never waits for learner 1. Learner 1's lead rank is SIGKILLed after step 12; its job
    restarts, resumes from its checkpoint of step 8 with the lr of its schedule there, and contributes a merge of
    weight > 0 again. The syncer is then SIGKILLed (once the refusals above were checked): every merge it had made
    survives (the versions run on without a gap) and, riding out the restart, no learner step lasts as long as the
    syncer was down (it never waited for it). The timings (rejoin seconds, worst step against typical) are the
    benchmark's (benchmarks/site_faults.py): on a loaded machine they move, the events here do not. The service restarted exactly once, exits 0 once both learners
    finished, and `diloco export` of its folder gives the syncer's last parameters; the run ends with a finite loss
    of them."""
    out = tmp_path / "run"
    up: queue.Queue = queue.Queue()
    checked = threading.Event()
    got: dict = {}

    def while_up(info: dict) -> None:  # (in run_sites' thread) hands the service over, holds the syncer kill
        up.put(info)
        if not checked.wait(timeout=300):
            raise TimeoutError("the checks on the live service did not finish")

    def run() -> None:
        try:
            got["result"] = run_sites(
                preset="tiny",
                sets=DEFAULT_SETS,
                out=out,
                cache_dir=token_cache,
                # site 1 of one rank (two until the suite was cut to time: ~7 s of CPU for a second rank whose
                # stop when its peer is killed test_train_torchrun.py shows)
                sites=[Site(0, ranks=2, sharding="fsdp"), Site(1, ranks=1)],
                kill_learner=(1, 12),
                kill_syncer=True,
                while_up=while_up,
            )
        except BaseException as exc:  # raised below, in the test's thread
            got["error"] = exc

    sites = threading.Thread(target=run, daemon=True)
    sites.start()
    try:
        while True:
            try:
                info = up.get(timeout=0.5)
                break
            except queue.Empty:
                assert sites.is_alive(), got.get("error")
        _refused_while_both_train(info, monkeypatch)
    finally:
        checked.set()
        sites.join(timeout=600)
    if "error" in got:
        raise got["error"]
    got = got["result"]

    kill, syncer = got["faults"]["learner_kill"], got["faults"]["syncer_kill"]
    assert kill["start_step"] == 8  # resumed from its newest checkpoint, not from step 0
    assert kill["lr_matches_schedule"]
    assert kill["first_merge_s"] is not None, kill  # it contributes again (how soon: benchmarks/site_faults.py)
    down_s = syncer["back_at"] - syncer["at"]  # a learner that waited for the syncer has a step this long
    for m in (0, 1):  # riding out, every step is shorter (the <= 2x typical figure: benchmarks/site_faults.py)
        learner = got["learners"][m]
        assert learner["worst_step_after_syncer_kill"] * learner["typical_step_s"] < down_s, (got["learners"], down_s)
    assert syncer["restored_merges"] is not None and syncer["restored_merges"] > 0
    assert got["versions_contiguous"]
    assert got["learners"][0]["steps"] == got["learners"][1]["steps"] == 120
    assert got["learners"][1]["superseded"] >= 4  # steps 9..12 of the killed process, done again
    assert math.isfinite(got["final_eval_loss"])

    # the service saw the restart (and no other) and says so, in its output, its summary and its events
    svc = out / "syncer"
    log = (out / "syncer.log").read_text()
    assert "the syncer restarted" in log and "every learner finished" in log
    merges = [json.loads(line) for line in (svc / "merges.jsonl").read_text().splitlines()]
    assert {m for r in merges for m in r["learners"]} == {0, 1}
    summary = json.loads((svc / "summary.json").read_text())
    assert summary["syncer_restarts"] == 1 and summary["merges"] == len(merges)
    events = [json.loads(line)["event"] for line in (svc / "syncer" / "events.jsonl").read_text().splitlines()]
    assert events.count("started") == 2
    states = sorted((svc / "syncer").glob("syncer-*.pt"))
    assert states and (svc / "syncer" / "records.jsonl").is_file()

    # `diloco export` of the service's folder: the actor's own last parameters
    from diloco.algorithm.fragments import flatten, split_fragments
    from diloco.cli import main
    from diloco.models.saving import load_transformer
    from diloco.train.inputs import run_fragments

    assert main(["export", str(svc), "--out", str(tmp_path / "model")]) == 0
    model = load_transformer(tmp_path / "model")
    final = torch.load(states[-1], map_location="cpu", weights_only=True)["syncer"]["global"]
    cfg = _cfg()
    frags = split_fragments(model, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=run_fragments(cfg, model))
    for frag, flat in zip(frags, final, strict=True):
        assert torch.equal(flatten(frag.params), flat)
