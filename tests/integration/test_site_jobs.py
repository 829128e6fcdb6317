"""Decoupled DiLoCo deployed as site jobs: each learner a ``diloco train`` run of its own (``learner=m``,
``syncer=NAME@HOST:PORT``) joining, over gRPC (:mod:`diloco.decoupled.rpc`, with the token), a syncer that runs as
a named Ray actor behind the service's gateway, against the same run with every learner a thread of one job.
Skipped without Ray (the optional ``ray`` extra), which the syncer's side needs (the sites do not)."""

from __future__ import annotations

import json
import sys
import threading

import pytest
import torch

ray = pytest.importorskip("ray")

from diloco.train.config import TrainConfig, load_preset  # noqa: E402
from diloco.train.trainer import Trainer, train_model  # noqa: E402

pytestmark = pytest.mark.timeout(180)

M, STEPS = 2, 16


def tiny(**kw) -> TrainConfig:
    base = {
        **load_preset("tiny")["base"],
        "method": "decoupled",
        "replicas": M,
        "global_batch": 8,
        "sync_every": 4,
        "num_fragments": 2,
        "overlap_steps": 1,
        "quorum": 0,
        "merge": "mean",
        "grace_gamma": 0.0,
        "steps": STEPS,
        "eval_every": STEPS,
    }
    return TrainConfig.from_dict({**base, **kw})


@pytest.fixture(scope="module")
def threads_run(tmp_path_factory, token_cache):
    """The run every site-job run here is compared with: its M learners threads of one job; its result and the
    number of merges it made."""
    out = tmp_path_factory.mktemp("threads")
    run = train_model(tiny(), out, cache_dir=token_cache, progress=False)
    return run, len((out / "merges.jsonl").read_text().splitlines())


TOKEN = "site-jobs-token"


@pytest.fixture
def token(monkeypatch) -> str:
    """The service's token, where a site's learner reads it (the printed command sets it so)."""
    monkeypatch.setenv("DILOCO_SYNCER_TOKEN", TOKEN)
    return TOKEN


def _start_syncer(cfg: TrainConfig, cache, name: str):
    """The syncer actor ``name`` and, as ``diloco syncer`` serves it, its gateway on a free port of loopback:
    (the actor, the inputs, the sites' ``NAME@127.0.0.1:PORT``, the gateway)."""
    from diloco.decoupled.ray_shards import RayShards
    from diloco.decoupled.rpc.gateway import Gateway, ray_backend
    from diloco.decoupled.trainer import make_syncers
    from diloco.train.inputs import prepare_inputs

    inputs = prepare_inputs(cfg, cache)
    shards = RayShards.start(make_syncers(cfg, inputs.model, inputs.fragments), name=name)
    handle = shards if shards.num_shards > 1 else shards.handles[0]
    gateway = Gateway(ray_backend(shards.handles, shards.num_shards), name=name, token=TOKEN, host="127.0.0.1", port=0)
    port = gateway.start()
    return handle, inputs, f"{name}@127.0.0.1:{port}", gateway


def test_site_jobs_of_one_rank_give_the_threads_run(local_ray, tmp_path, token_cache, threads_run, token):
    """K = M, mean, no grace window, equal work: every round merges the same reports in learner order, so two
    site jobs (each its own trainer, its own folder) and one job of two learner threads end with the same
    syncer parameters, hence the same final loss, to the bit."""
    from diloco.train.evaluation import evaluate_parameters

    run, threads_merges = threads_run
    handle, inputs, spec, gateway = _start_syncer(tiny(), token_cache, "site-eq")
    results, errors = {}, []

    def site(m: int) -> None:
        try:
            cfg = tiny(learner=m, syncer=spec)
            results[m] = Trainer(cfg, tmp_path / f"site-{m}", cache_dir=token_cache, progress=False).run()
        except BaseException as exc:  # reported below with the learner named
            errors.append((m, exc))

    jobs = [threading.Thread(target=site, args=(m,)) for m in range(M)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    assert not errors, errors
    final = ray.get(handle.global_named_parameters.remote())
    records = ray.get(handle.records.remote())
    ray.kill(handle)
    gateway.stop()
    loss = evaluate_parameters(inputs.model, final, inputs.val_batches, bf16=False, device=torch.device("cpu"))
    assert loss == run.final_eval_loss
    assert len(records) == threads_merges
    for m in range(M):  # each site's folder holds its own learner's rows, a row per step
        joined, *rows = [
            json.loads(line) for line in (tmp_path / f"site-{m}" / f"learner-{m}.jsonl").read_text().splitlines()
        ]
        assert joined["event"] == "joined" and joined["learner"] == m
        assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
        assert results[m].wait_share is not None and len(results[m].wait_share) == 1


def test_a_site_job_needs_both_learner_and_syncer():
    with pytest.raises(ValueError, match="gives both"):
        tiny(learner=0)
    with pytest.raises(ValueError, match="NAME@ADDRESS"):
        tiny(learner=0, syncer="no-address")
    with pytest.raises(ValueError, match="one learner of 0..1"):
        tiny(learner=2, syncer="s@127.0.0.1:6379")
    with pytest.raises(ValueError, match="method=decoupled site jobs"):
        tiny(method="streaming", learner=0, syncer="s@127.0.0.1:6379")


#: A site job's process that reports, after its run, every Ray module it loaded (and fails if there is one).
_RAY_FREE = (
    "import json, sys\n"
    "from diloco.cli import main\n"
    "rc = main(json.loads(sys.argv[1]))\n"
    "loaded = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))\n"
    "print('ray modules loaded:', loaded, flush=True)\n"
    "sys.exit(rc or (3 if loaded else 0))\n"
)


def _sites(
    local_ray: str,
    tmp_path,
    token_cache,
    name: str,
    *,
    ranks: dict[int, int] | None = None,
    sharded: tuple[int, ...] = (),
    plain: bool = False,
    **kw,
) -> dict:
    """Run the M learners as site jobs against a fresh syncer actor named ``name``: learner m in a thread of this
    process, or (``ranks[m]`` = R > 1) as a torchrun job of R gloo ranks; the syncer's final parameters, its
    merges and the final loss of those parameters. ``plain``: each site in ``ranks`` (of one rank) is a plain
    ``diloco train`` process that reports the Ray modules it has loaded at its end (:data:`_RAY_FREE`)."""
    import subprocess

    from diloco.distributed.launch import child_environment, torchrun_command
    from diloco.train.evaluation import evaluate_parameters

    handle, inputs, spec, gateway = _start_syncer(tiny(**kw), token_cache, name)
    procs, errors = [], []
    for m, r in (ranks or {}).items():
        sets = [f"{k}={v}" for k, v in {**kw, "learner": m, "syncer": spec, "ranks_per_worker": r}.items()]
        if m in sharded:  # this site's ranks hold one model fully_shard'ed between them
            sets.append("worker_sharding=fsdp")
        args = ["train", "--preset", "tiny", "--no-progress", "--out", str(tmp_path / f"{name}-{m}")]
        args += ["--cache-dir", str(token_cache), "--method", "decoupled", "--set", "threads=1"]
        for k, v in tiny(**kw).to_dict().items():
            if k in (
                "replicas",
                "global_batch",
                "sync_every",
                "num_fragments",
                "overlap_steps",
                "quorum",
                "merge",
                "grace_gamma",
                "steps",
                "eval_every",
            ):
                args += ["--set", f"{k}={v}"]
        for s in sets:
            args += ["--set", s]
        log = open(tmp_path / f"{name}-{m}.log", "wb")
        command = torchrun_command(nproc=r, args=args)
        if plain:  # `python -m diloco train` of one rank, which says which Ray modules it loaded (none, it must be)
            assert r == 1
            command = [sys.executable, "-c", _RAY_FREE, json.dumps(args)]
        env = child_environment(DILOCO_SYNCER_TOKEN=TOKEN)
        procs.append((m, subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log))

    def site(m: int) -> None:
        try:
            cfg = tiny(**kw, learner=m, syncer=spec)
            Trainer(cfg, tmp_path / f"{name}-{m}", cache_dir=token_cache, progress=False).run()
        except BaseException as exc:  # reported below with the learner named
            errors.append((m, exc))

    jobs = [threading.Thread(target=site, args=(m,)) for m in range(M) if m not in (ranks or {})]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    for m, proc, log in procs:
        rc = proc.wait(timeout=150)
        log.close()
        assert rc == 0, (tmp_path / f"{name}-{m}.log").read_text()[-3000:]
    assert not errors, errors
    final = ray.get(handle.global_named_parameters.remote())
    records = ray.get(handle.records.remote())
    ray.kill(handle)
    gateway.stop()
    loss = evaluate_parameters(inputs.model, final, inputs.val_batches, bf16=False, device=torch.device("cpu"))
    return {"global": final, "merges": records, "loss": loss}


def test_a_site_job_of_two_ranks_and_muon_are_honoured(local_ray, tmp_path, token_cache, threads_run, token):
    """Learner 1 as a torchrun job of 2 gloo ranks (its lead rank holds the link, the other shares its replies)
    and learner 0 a site job of one rank: the threads run's syncer parameters to the tolerance the torchrun
    tests derive (a learner's two half-batch gradients are summed in another order). The same run with
    inner_optimizer=muon, learner 1 a ``diloco train`` process of its own (given the optimizer on its command line)
    and learner 0 in this process, ends at the Muon threads run's loss and elsewhere than AdamW's, so a site job
    honours the inner optimizer. (Muon's site was a torchrun job of 2 ranks too until the suite was cut to time:
    3 processes and a second torchrun start for what the AdamW run above already shows of 2 ranks.)"""
    run, threads_merges = threads_run
    two = _sites(local_ray, tmp_path, token_cache, "site-r2", ranks={1: 2})
    assert len(two["merges"]) == threads_merges
    assert two["loss"] == pytest.approx(run.final_eval_loss, rel=1e-5)
    muon = _sites(local_ray, tmp_path, token_cache, "site-muon", ranks={1: 1}, plain=True, inner_optimizer="muon")
    muon_threads = train_model(
        tiny(inner_optimizer="muon"), tmp_path / "threads-muon", cache_dir=token_cache, progress=False
    )
    # both sites with Muon: the Muon threads run's loss (the tolerance above)
    assert muon["loss"] == pytest.approx(muon_threads.final_eval_loss, rel=1e-5)
    assert abs(muon["loss"] - run.final_eval_loss) > 1e-3


def test_a_site_job_of_fsdp_ranks_gives_the_threads_run(local_ray, tmp_path, token_cache, threads_run, token):
    """Learner 0 as a torchrun job of 2 ranks holding one model fully_shard'ed between them (each rank its shard of
    the parameters and of the global copy; reports gathered whole, replies cut into shards) and learner 1 a site
    job of one rank: the threads run's final loss to the torchrun tests' tolerance."""
    run, threads_merges = threads_run
    fsdp = _sites(local_ray, tmp_path, token_cache, "site-fsdp", ranks={0: 2}, sharded=(0,))
    assert len(fsdp["merges"]) == threads_merges
    assert fsdp["loss"] == pytest.approx(run.final_eval_loss, rel=1e-5)
    latest = json.loads((tmp_path / "site-fsdp-0" / "checkpoints" / "latest.json").read_text())
    assert latest["format"] == "dcp" and latest["config"]["worker_sharding"] == "fsdp"  # sharded, each rank its shard


def test_a_site_job_needs_no_ray(local_ray, tmp_path, token_cache, threads_run, token):
    """Learner 0 as a plain ``diloco train`` process that talks to the service over gRPC alone: at its end no Ray
    module is loaded in it (so none was imported, and no Ray node or raylet started there), and with learner 1 a
    thread as before the run is the threads run to the bit (K = M, mean)."""
    run, threads_merges = threads_run
    got = _sites(local_ray, tmp_path, token_cache, "site-noray", ranks={0: 1}, plain=True)
    assert "ray modules loaded: []" in (tmp_path / "site-noray-0.log").read_text()
    assert len(got["merges"]) == threads_merges
    assert got["loss"] == run.final_eval_loss


def test_site_jobs_of_a_sharded_syncer_give_the_threads_run(local_ray, tmp_path, token_cache, threads_run, token):
    """syncer_shards=2 (one fragment a shard actor, both behind one gateway): each site's channel is a channel per
    shard over the one gRPC link; with K = M a sharded syncer is one syncer, so the threads run to the bit."""
    from diloco.train.evaluation import evaluate_parameters

    run, threads_merges = threads_run
    shards, inputs, spec, gateway = _start_syncer(tiny(syncer_shards=2), token_cache, "site-shards")
    errors = []

    def site(m: int) -> None:
        try:
            cfg = tiny(learner=m, syncer=spec, syncer_shards=2)
            Trainer(cfg, tmp_path / f"site-{m}", cache_dir=token_cache, progress=False).run()
        except BaseException as exc:  # reported below with the learner named
            errors.append((m, exc))

    jobs = [threading.Thread(target=site, args=(m,)) for m in range(M)]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join()
    assert not errors, errors
    final = shards.global_named_parameters()
    merges = len(shards.records())
    shards.kill()
    gateway.stop()
    assert merges == threads_merges
    loss = evaluate_parameters(inputs.model, final, inputs.val_batches, bf16=False, device=torch.device("cpu"))
    assert loss == run.final_eval_loss
