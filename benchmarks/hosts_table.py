"""Data-parallel, Streaming DiLoCo and Decoupled DiLoCo across 3 emulated hosts with shaped links, measured, beside
the simulator's prediction for the same link, bytes and step time.

Every run is real processes on hosts of :mod:`diloco.testing.hosts` (own network, mount, UTS and PID namespaces on
a bridge; own address, hostname, ``/etc/hosts`` and ``/tmp``, the token cache copied into each as a machine holds
its data), each host's link shaped by HTB to the rate (its upload and its download):

* **dp** and **streaming** (P = 3, tau = 1, FP4 e3m0: the tiny preset's): the README's multi-node command on every
  host, ``torchrun --nnodes 3 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint host0:29400 ... -m diloco
  train ... --out /tmp/run`` (each host its own folder; the lead's metrics on host0 are read).
* **decoupled** (same H, P, tau and codec, quorum K = 2): ``diloco syncer`` on host0 (Ray inside host0, gRPC on
  host0:29500), and on each host the site command it printed (one learner a host). K = 2 of M = 3: every merge
  averages at least two learners (K = 1 would let one learner's drift become the global model alone), yet no
  merge waits for the slowest learner of three (K = 3 is synchronous). The syncer shares host0 with learner 0:
  learner 0 reaches it without crossing a link, learners 1 and 2 cross theirs and host0's.

Model: the tiny preset at ``size=cpu-0.25m`` (312k parameters at its 512-token vocabulary; tiny's own 70k
move too few bytes for 50 Mbit/s to matter: DP's fp32 gradients are 1.7 MB a worker a step here, 0.27 s at
50 Mbit/s against a 0.1 s step), global batch 12 (4 sequences a worker), one intra-op thread, every step padded to
``step_time`` = 0.1 s (an accelerator's step: three hosts on two cores do not slow each other's compute),
checkpoints only at the end. Columns: see :mod:`diloco.bench.hosts_table`.

    sudo .venv/bin/python benchmarks/hosts_table.py            # 2 rates x 3 methods, 3-5 minutes on 2 cores
    sudo .venv/bin/python benchmarks/hosts_table.py --quick    # 50 Mbit/s, 16 steps: checks it runs

Needs root (namespaces) and iproute2 / util-linux; refuses otherwise. Writes benchmarks/results/hosts_table.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from diloco.bench import add_out, add_quick, machine, print_table, write_result
from diloco.bench.hosts_table import COLUMNS, gaps, learner_window, predict, sync_window
from diloco.decoupled.chaos_logs import kept_steps, read_learner_log
from diloco.decoupled.site_faults import site_command
from diloco.files import default_cache_dir
from diloco.testing.hosts import Host, Hosts, unavailable

SRC = str(Path(__file__).resolve().parents[1] / "src")
HOSTS = 3
SIZE, SEQ, VOCAB = "cpu-0.25m", 32, 512  # the tiny preset's seq_len and vocab
H, P, TAU = 8, 3, 1  # the tiny preset's streaming
METHODS = ("dp", "streaming", "decoupled")


def common_sets(args: argparse.Namespace) -> list[str]:
    sets = {
        "size": SIZE,
        "replicas": HOSTS,
        "global_batch": 12,
        "steps": args.steps,
        "eval_every": args.steps,
        "threads": 1,
        "step_time": args.step_time,
        "checkpoint_every": 0,
    }
    return [x for k, v in sets.items() for x in ("--set", f"{k}={v}")]


def env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME", "PYTHONPATH")
    keep = {k: v for k, v in os.environ.items() if k not in drop}
    return keep | {"PYTHONPATH": SRC, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _finish(procs: list, timeout: float) -> None:
    end = time.monotonic() + timeout
    for p in procs:
        try:
            rc = p.wait(timeout=max(1.0, end - time.monotonic()))
        except Exception:
            rc = None
        if rc != 0:
            tail = p.stdout_path.read_text()[-1500:] + p.stderr_path.read_text()[-3000:]
            raise RuntimeError(f"{p.args[:8]}... exited with {rc}:\n{tail}")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_sync(hosts: list[Host], method: str, args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(HOSTS), "--nproc-per-node", "1"]
    cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "host0:29400", "--rdzv-id", run_id]
    cmd += ["-m", "diloco", "train", "--preset", "tiny", "--method", method, *common_sets(args)]
    cmd += ["--no-progress", "--out", f"/tmp/{run_id}", "--cache-dir", "/tmp/cache"]
    t0 = time.monotonic()
    procs = [h.run(cmd, env=env(), cwd="/", name=run_id) for h in hosts]
    _finish(procs, args.timeout)
    wall = time.monotonic() - t0
    run = hosts[0].path(f"/tmp/{run_id}")
    summary = json.loads((run / "summary.json").read_text())
    tokens_per_step = summary["tokens"] / summary["steps"]
    skip = 2 if method == "dp" else H
    got = sync_window(_rows(run / "metrics.jsonl"), skip=skip, last=args.steps, tokens_per_step=tokens_per_step)
    return got | {
        "wall_s": wall,
        "tokens_per_step": tokens_per_step,
        "num_params": summary["num_params"],
        "final_eval_loss": summary["final_eval_loss"],
        "goodput_tokens_per_s": summary["tokens"] / summary["train_time_s"],
        "useful_share": 1.0,
    }


def run_decoupled(hosts: list[Host], args: argparse.Namespace, run_id: str) -> dict[str, Any]:
    sets = common_sets(args) + ["--set", f"num_fragments={P}", "--set", f"overlap_steps={TAU}"]
    sets += ["--set", f"sync_every={H}", "--set", "codec=fp4_e3m0", "--set", f"quorum={args.quorum}"]
    t0 = time.monotonic()
    service = hosts[0].run(
        [sys.executable, "-m", "diloco", "syncer", "--preset", "tiny", *sets, "--cache-dir", "/tmp/cache"]
        + ["--out", f"/tmp/{run_id}-syncer", "--poll", "2", "--host", "0.0.0.0", "--advertise", "host0"]
        + ["--port", "29500"],
        env=env(),
        cwd="/",
        name=f"{run_id}-syncer",
    )
    info_path = hosts[0].path(f"/tmp/{run_id}-syncer/syncer.json")
    while not info_path.is_file():
        if service.poll() is not None or time.monotonic() - t0 > args.timeout:
            tail = service.stdout_path.read_text()[-1500:] + service.stderr_path.read_text()[-3000:]
            raise RuntimeError(f"the syncer did not start (exit {service.poll()}):\n{tail}")
        time.sleep(0.2)
    time.sleep(0.2)  # written atomically; read once whole
    info = json.loads(info_path.read_text())
    procs = [service]
    for m, h in enumerate(hosts):
        site_env, command = site_command(info["learners"][m], ranks=1)
        command += ["--out", f"/tmp/{run_id}-site", "--cache-dir", "/tmp/cache", "--no-progress"]
        procs.append(h.run(command, env=env() | site_env, cwd="/", name=f"{run_id}-site"))
    _finish(procs[1:] + procs[:1], args.timeout)
    wall = time.monotonic() - t0
    steps, metrics = {}, {}
    for m, h in enumerate(hosts):
        site = h.path(f"/tmp/{run_id}-site")
        steps[m] = read_learner_log(site / f"learner-{m}.jsonl")
        metrics[m] = {int(r["step"]): r for r in _rows(site / "metrics.jsonl") if "loss" in r}
    for m in steps:  # the learner's cumulative bytes beside its step rows
        steps[m] = [
            r | {"bytes_sent": metrics[m][int(r["step"])]["bytes_sent"]} if "step" in r else r for r in steps[m]
        ]
    rows = [r for m in steps for r in steps[m] if "step" in r and "dt" in r]
    by_learner = {m: [r for r in rows if r.get("learner") == m] for m in steps}
    per_learner_tokens = next(iter(metrics[0].values()))["tokens"]
    got = learner_window(by_learner, skip=H, last=args.steps, tokens_per_step=per_learner_tokens)
    kept, _ = kept_steps(rows)
    span = max(float(r["t"]) for r in kept) - min(float(r["t"]) - float(r["dt"]) for r in kept)
    all_steps = sum(len(v) for v in by_learner.values())
    starts = [min(float(r["t"]) - float(r["dt"]) for r in v) for v in by_learner.values()]
    summary = json.loads(hosts[0].path(f"/tmp/{run_id}-syncer/summary.json").read_text())
    site0 = json.loads((hosts[0].path(f"/tmp/{run_id}-site") / "summary.json").read_text())
    return got | {
        "wall_s": wall,
        "tokens_per_step": HOSTS * per_learner_tokens,
        "num_params": site0["num_params"],
        "final_eval_loss": summary["final_eval_loss"],
        "goodput_tokens_per_s": len(kept) * per_learner_tokens / span,
        "useful_share": len(kept) / all_steps,
        "merges": summary.get("merges"),
        "start_spread_s": max(starts) - min(starts),  # between the learners' first steps
    }


def shape() -> dict[str, Any]:
    from diloco.models import Transformer, make_config

    model = Transformer(make_config(SIZE, vocab_size=VOCAB, seq_len=SEQ))
    n = sum(p.numel() for p in model.parameters())
    return {"num_layers": len(model.blocks), "non_block_params": n - sum(p.numel() for p in model.blocks.parameters())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="1000,50", help="Mbit/s each way per host (HTB), comma-separated")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of: {', '.join(METHODS)}")
    ap.add_argument("--steps", type=int, default=48, help="steps a run (a multiple of H = 8)")
    ap.add_argument("--step-time", type=float, default=0.1, help="every step padded to this many seconds")
    ap.add_argument("--quorum", type=int, default=2, help="decoupled: K learners a merge needs (of 3)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take before it is an error")
    add_quick(ap, "50 Mbit/s only, 16 steps")
    add_out(ap, "hosts_table")
    args = ap.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"hosts_table: {reason}; run it as root: sudo .venv/bin/python benchmarks/hosts_table.py")
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise SystemExit(f"--methods: {', '.join(bad)} unknown; choose from {', '.join(METHODS)}")
    if args.quick:
        args.rates, args.steps = "50", 16
    if args.steps % H or args.steps < 2 * H:
        raise SystemExit(f"--steps {args.steps}: a multiple of H = {H}, at least {2 * H} (one round is skipped)")
    rates = [float(r) for r in args.rates.split(",")]
    geometry = shape()
    load_before = os.getloadavg()
    rows = []
    began = time.monotonic()
    for mbps in rates:
        with Hosts(HOSTS, rate_mbit=mbps) as hosts:
            for h in hosts:
                shutil.copytree(default_cache_dir(), h.path("/tmp/cache"))
            for method in methods:
                run_id = f"{method}-{mbps:g}"
                print(f"{mbps:g} Mbit/s, {method} ...", flush=True)
                if method == "decoupled":
                    got = run_decoupled(hosts, args, run_id)
                else:
                    got = run_sync(hosts, method, args, run_id)
                row = {"mbps": mbps, "method": method} | got
                row |= predict(
                    method=method,
                    mbps=mbps,
                    compute_s_per_step=got["compute_s_per_step"],
                    bytes_per_step=got["bytes_per_step"],
                    tokens_per_step=got["tokens_per_step"],
                    num_params=got["num_params"],
                    workers=HOSTS,
                    sync_every=H,
                    num_fragments=P,
                    overlap_steps=TAU,
                    **geometry,
                )
                rows.append(row | gaps(row))
    title = (
        f"{HOSTS} emulated hosts (HTB per host), tiny preset at {SIZE}, {args.steps} steps padded to "
        f"{args.step_time:g} s; streaming/decoupled H={H} P={P} tau={TAU} FP4; decoupled K={args.quorum}"
    )
    print_table(rows, COLUMNS, title=title)
    load_after = os.getloadavg()
    print(
        f"load average before {load_before[0]:.1f}, after {load_after[0]:.1f} (1 min); {time.monotonic() - began:.0f} s"
    )
    config = {k: v for k, v in vars(args).items() if k != "out"}
    payload = {
        "machine": machine() | {"load_before": list(load_before), "load_after": list(load_after)},
        "config": config | {"size": SIZE, "hosts": HOSTS, "H": H, "P": P, "tau": TAU, "exchange": "reduce_scatter"},
        "geometry": geometry,
        "rows": rows,
    }
    write_result("hosts_table", payload, out=args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
