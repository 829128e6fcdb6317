"""Decoupled DiLoCo deployed across emulated hosts (:mod:`_deploy`): the service on host 0, a site on host 1 (one
rank) and a site on host 2 (two gloo ranks sharding one model with FSDP), each running the command the service
printed. Against the run with its learners threads of one job (test_site_jobs.py's reference). Root only."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("ray")

from _deploy import (
    SERVICE_OUT,
    fsdp_site,
    give_cache,
    learner_log,
    printed_commands,
    ray_processes,
    rows,
    run_site,
    start_service,
    wait,
)

from diloco.testing.deploy_env import contiguous
from diloco.testing.hosts import Hosts, unavailable

pytestmark = [pytest.mark.hosts, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

STEPS = 16
SETS = {
    "replicas": 2,
    "global_batch": 8,
    "sync_every": 4,
    "num_fragments": 2,
    "overlap_steps": 1,
    "quorum": 0,
    "merge": "mean",
    "grace_gamma": 0.0,
    "steps": STEPS,
    "eval_every": STEPS,
    "threads": 1,
}


@pytest.mark.slow  # 31-40 s on 2 cores (load 4-12): Ray on host 0, a torchrun job of 1 rank and one of 2 ranks
@pytest.mark.timeout(300)
def test_sites_on_two_hosts_give_the_threads_run(tmp_path, token_cache):
    """K = M, mean merge, no grace window: every round merges the same two reports in learner order, so the sites on
    hosts 1 and 2 (host 2's two ranks shard the model) end with the syncer holding the threads run's parameters:
    the same final loss to the bit (test_site_jobs.py's FSDP test allows rel 1e-5, for a rank's half-batch
    gradients summed in another order; here they come out equal), the same number of merges, versions without a
    gap. The service ends with
    every learner finished and `diloco export` of its folder loads. Ray runs on host 0 (its raylet is seen there)
    and on neither site host."""
    from diloco.cli import main
    from diloco.models.saving import load_transformer
    from diloco.train.config import TrainConfig, load_preset
    from diloco.train.trainer import train_model

    ref_cfg = TrainConfig.from_dict({**load_preset("tiny")["base"], "method": "decoupled", **SETS})
    ref = train_model(ref_cfg, tmp_path / "threads", cache_dir=token_cache, progress=False)
    ref_merges = len((tmp_path / "threads" / "merges.jsonl").read_text().splitlines())

    with Hosts(3) as (h0, h1, h2):
        began = time.monotonic()
        service = start_service(h0, token_cache, SETS)
        lines, service = printed_commands(h0, service, token_cache=token_cache, sets=SETS)
        for h in (h1, h2):
            give_cache(h, token_cache)
        sites = [run_site(h1, lines[0], "site-0"), run_site(h2, fsdp_site(lines[1]), "site-1")]
        # while both sites train: Ray's processes on host 0, none on a site host
        wait(
            "both learners' first steps",
            lambda: all(
                any("step" in r for r in rows(learner_log(h, line, m)))
                for m, (h, line) in enumerate(((h1, lines[0]), (h2, lines[1])))
            ),
            timeout=180,
            procs=[service, *sites],
        )
        assert ray_processes(h0), "no Ray process seen on host 0: the check would see none anywhere"
        assert ray_processes(h1) == [] and ray_processes(h2) == []
        for p in sites:
            assert p.wait(timeout=180) == 0, p.stderr_path.read_text()[-3000:]
        assert service.wait(timeout=120) == 0, service.stderr_path.read_text()[-3000:]
        seconds = time.monotonic() - began
        out = service.stdout_path.read_text()
        assert "every learner finished" in out
        svc = h0.path(SERVICE_OUT)
        summary = json.loads((svc / "summary.json").read_text())
        merges = rows(svc / "merges.jsonl")
        assert summary["learners"] == 2 and summary["merges"] == len(merges) == ref_merges
        assert contiguous(merges) and {m for r in merges for m in r["learners"]} == {0, 1}
        assert summary["final_eval_loss"] == ref.final_eval_loss  # to the bit (seen so; the FSDP tests allow 1e-5)
        assert main(["export", str(svc), "--out", str(tmp_path / "model")]) == 0
        assert load_transformer(tmp_path / "model") is not None
    print(f"deployed run: {seconds:.1f} s; loss {summary['final_eval_loss']!r} vs threads {ref.final_eval_loss!r}")
