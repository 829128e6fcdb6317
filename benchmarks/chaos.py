"""Decoupled DiLoCo under faults, against synchronous Streaming DiLoCo on the same engine and the peers.

Every run trains the project's transformer on the bundled text with M learner processes (Ray actors on a
local Ray instance, each running the trainer as a site job) and one syncer actor
(:mod:`diloco.decoupled.ray_learners`), at equal tokens: the learners stop together once they have trained
``--steps x --global-batch x --seq-len`` tokens that reached the syncer (lost work is redone), batch
``--global-batch / M`` each, the inner lr's cosine over ``--steps``. The learners run the trainer: each ends
at ``--steps`` steps (the schedule's end; with ``learner_budget=tokens`` they share the budget instead, a fast
one past ``--steps``, a straggler ending early), and a restarted one starts its schedule again (no checkpoint
before the end). Which loop measured a row is its ``loop`` column: ``trainer`` for the rows of ``--trainer``
(``benchmarks/results/chaos-trainer.json``), ``plain`` for the rows in ``chaos.json`` and ``chaos-guard.json``,
measured with the learners' earlier plain loop (their own sampler and lr, whose horizon a fast learner could run
past; rerun with ``--fresh`` to measure them on the trainer). Steps are padded to ``--step-time`` seconds (an
accelerator's step: the CPU is idle meanwhile, so 4 learners share 2 cores without slowing each other);
wall-clock and goodput are in that emulated time. Methods:

* ``sync``: quorum K = M, mean merge, no grace window: synchronous Streaming DiLoCo (bit-identical to
  :class:`diloco.StreamingDiLoCo` on the same reports, tested), here with live rejoin: a killed learner's
  restart joins the next rounds; until then every round waits for it;
* ``decoupled``: K = 1 with the adaptive grace window, RDA merge (``decoupled-mean``: mean merge), every merge a
  whole outer step (``outer_scale="none"``, as these rows were first measured); ``-default``: today's default
  share of an outer step per merge (``outer_scale="auto"``);
  ``-own``: the learner's own outer gradient (``outer_gradient="own"``); ``-scaled``: a merge of k of M
  learners is a k/M share of an outer step (``outer_scale="share"``).

Faults (the same schedule for every method): ``kill``: SIGKILL learner 1 at 10 s and at 25 s, each
restart held down 3 s (a restarted torchft group in the peer benchmark comes back 3 s later too);
``straggler``: learner M-1 3x slower. Reported per run: final eval loss of the syncer's parameters,
wall-clock, goodput (useful learner-seconds / allocated; :func:`diloco.decoupled.chaos_logs.goodput`), for
each kill the survivors' longest step / their typical step, the share of their steps they kept in the
10 s after it, and seconds from the restarted learner joining to its first merge with weight > 0.

* ``dp``: data-parallel, ``diloco train --method dp --elastic`` with M worker processes under one torchrun
  agent (``benchmarks/chaos_dp.py``; the inner step padded by ``benchmarks/_padded_train.py``), the same model,
  global batch, tokens and schedule: a kill makes TorchElastic restart every worker from the newest committed
  checkpoint (the trainer's default for data-parallel: every 100 steps; ``dp-ckpt16``: every 16), the killed
  worker's process held down 3 s; its figures from :func:`diloco.decoupled.chaos_logs.summarize_restarts` (a step
  trained again after a restart counts once in goodput; rejoin: the restarted worker's first step that stays
  in the final trajectory).

* ``torchft``: the peer, torchft 0.2.0's DiLoCo with live healing (``benchmarks/chaos_torchft.py``): M replica
  groups of one process, a lighthouse with a 2 s heartbeat timeout, the same model, data, batch, tokens,
  inner schedule, H, τ and outer optimizer, torchft's own 2 fragments; a killed replica's new process (3 s
  later) heals from a peer at its first quorum.

Beside it: data-parallel in one process without faults (``dp``, M = 1: loss only), and torchft's healing
measured on its own (``benchmarks/torchft_healing.py``, if present: its JSON is read).

    PYTHONPATH=src python benchmarks/chaos.py                 # ~50 minutes on 2 cores (39 runs)
    PYTHONPATH=src python benchmarks/chaos.py --quick         # ~8 minutes: M = 2, fewer steps (19 runs)
    PYTHONPATH=src python benchmarks/chaos.py --guard         # ~6 minutes: the contribution guard's 5 rows
    PYTHONPATH=src python benchmarks/chaos.py --trainer       # ~20 minutes: the trainer loop's 16 rows (M = 4, 3)
    PYTHONPATH=src python benchmarks/chaos.py --report        # seconds: the table and JSON from the stored runs

``--guard``: M = 3, K = M, RDA at outer lr 0.7 / sqrt(3): no fault; learner 1 sends 1e4 x its outer gradient
from 10 s to 15 s (``corrupt``), or N(0, 1) values (``corrupt-random``), with the guard on (the default) and
without it (``-noguard``).

``--trainer``: the trainer's loop, M = 4 (``--replicas 2,4`` adds M = 2), RDA, ``outer_scale=auto``; a
waiting-share column (each learner's share of its step time spent waiting for replies, and their mean):
``decoupled-default`` (K = 1, today's defaults) without faults, and ``decoupled-rideout`` (the same with
``ride_out_steps=64``) with the syncer SIGKILLed by pid at 12 s (``syncer-kill``: Ray restarts it from its
checkpoint), seeds 0, 1 and 2 each, their final loss paired by seed; ``decoupled-alone`` (``late_reports=alone``);
``decoupled-khalf`` and ``-khalf-alone`` (K = M / 2 with ``next`` and ``alone``); a 3x straggler at K = 1 with
each learner's own ``--steps`` (``decoupled-default``) and at K = M (``decoupled-k=m-default``), and with the
budget shared (``learner_budget=tokens``: measured before site jobs took it, so in one ``diloco train`` process with the
learners as threads, ``benchmarks/chaos_threads.py``: ``threads-tokens``, beside K = M there, ``threads-k=m``);
and M = 3, K = 2 with ``next`` and ``alone`` (``decoupled-k2``, ``-k2-alone``: a slot's three reports, of which
the third misses the merge). Its runs file is ``chaos-runs-trainer.jsonl``.

Resumable: each finished run is a row of ``benchmarks/results/chaos-runs.jsonl`` (runs already there are
skipped; ``--rerun METHOD,...`` runs those again, appending rows that supersede the old ones; ``--fresh`` starts
over in a new file); the table goes to ``benchmarks/results/chaos.json`` (``diloco.bench``'s table and writer).
``--report`` runs nothing: it prints the table and writes the JSON again from the runs file (the rows stored now
give back the stored JSON byte for byte).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch
from chaos_dp import dp_run
from chaos_threads import threads_run
from chaos_torchft import torchft_run

from diloco.bench import RESULTS_DIR, add_quick, print_table, result_path, write_result
from diloco.bench.chaos_table import columns_for, paired_difference
from diloco.data import prepare_tokens
from diloco.decoupled.chaos import Chaos
from diloco.decoupled.ray_learners import run_on_ray
from diloco.files import default_cache_dir, read_jsonl
from diloco.train.config import TrainConfig, load_preset

RESULTS = RESULTS_DIR
METHODS = {
    "sync": dict(quorum=None, merge="mean", grace_gamma=0.0),
    # outer_scale="none": every merge a whole outer step, as these rows were measured (the default now scales)
    "decoupled": dict(quorum=1, merge="rda", outer_scale="none"),
    "decoupled-mean": dict(quorum=1, merge="mean", outer_scale="none"),
    "decoupled-own": dict(quorum=1, merge="rda", outer_gradient="own", outer_scale="none"),
    "decoupled-mean-own": dict(quorum=1, merge="mean", outer_gradient="own", outer_scale="none"),
    "decoupled-own-scaled": dict(quorum=1, merge="rda", outer_gradient="own", outer_scale="share"),
    # RDA keeps the norm of nearly orthogonal outer gradients (~sqrt(M) x the mean's): its outer lr / sqrt(M)
    "decoupled-lr-sqrtm": dict(quorum=1, merge="rda", outer_lr_over_sqrt_m=True, outer_scale="none"),
    # today's defaults: K = 1, a merge of k of M learners a share of an outer step (outer_scale="auto":
    # sqrt(k/M) for RDA, k/M for the mean; studies/decoupled-quorum)
    "decoupled-default": dict(quorum=1, merge="rda", outer_scale="auto"),
    "decoupled-mean-default": dict(quorum=1, merge="mean", outer_scale="auto"),
    # the contribution guard's rows (--guard): K = M, RDA at 0.7 / sqrt(M); the guard on (default) or off
    "decoupled-k=m": dict(quorum=None, merge="rda", outer_lr_over_sqrt_m=True),
    "decoupled-k=m-noguard": dict(quorum=None, merge="rda", outer_lr_over_sqrt_m=True, guard="off"),
    # the trainer-loop rows (--trainer): today's defaults (K = 1, RDA, outer_scale auto, late_reports next) and
    # one setting changed each
    "decoupled-alone": dict(quorum=1, merge="rda", late_reports="alone"),
    "decoupled-khalf": dict(quorum="half", merge="rda"),  # K = M // 2
    "decoupled-khalf-alone": dict(quorum="half", merge="rda", late_reports="alone"),
    "decoupled-k2": dict(quorum=2, merge="rda"),  # K = 2 of 3: a slot's third report misses its merge
    "decoupled-k2-alone": dict(quorum=2, merge="rda", late_reports="alone"),
    "decoupled-tokens": dict(quorum=1, merge="rda", learner_budget="tokens"),  # threads only (THREADS)
    "decoupled-k=m-default": dict(quorum=None, merge="rda"),
    "decoupled-rideout": dict(quorum=1, merge="rda", ride_out_steps=64),
}

# rows whose learners are threads of one `diloco train` process (benchmarks/chaos_threads.py): the config of
# the method named; learner_budget=tokens (measured before site jobs took it) has its straggler rows there, beside K = M
THREADS = {"threads-tokens": "decoupled-tokens", "threads-k=m": "decoupled-k=m-default"}
DP_METHODS = {"dp": None, "dp-ckpt16": 16}  # data-parallel under TorchElastic: checkpoint_every (None: the default)


def faults(name: str, M: int) -> Chaos:
    if name == "kill":
        return Chaos(kills=((10.0, 1), (25.0, 1)), downtime_s=3.0)
    if name == "syncer-kill":  # the syncer SIGKILLed by pid mid-run; Ray restarts it from its checkpoint
        return Chaos(syncer_kills=(12.0,))
    if name == "straggler":
        return Chaos(slowdown=tuple([1.0] * (M - 1) + [3.0]))
    if (
        name == "corrupt"
    ):  # learner 1 sends 1e4 x its outer gradient from 10 s to 15 s (`diloco chaos --corrupt 10:1:1e4`)
        return Chaos(corrupt=((10.0, 1, 1e4, 5.0),))
    if name == "corrupt-random":  # the same window, N(0, 1) values (`--corrupt 10:1`)
        return Chaos(corrupt=((10.0, 1, None, 5.0),))
    return Chaos()


def one_run(*, method: str, M: int, fault: str, args, data, work: Path, seed: int | None = None) -> dict:
    """One decoupled run on Ray: each learner a trainer site job (the trainer's loop, AdamW, its lr schedule over
    ``--steps``), at equal tokens through the driver's STOP file."""
    kw = dict(METHODS[THREADS.get(method, method)])
    if kw.get("quorum") == "half":
        kw["quorum"] = M // 2
    outer_lr = 0.7 / math.sqrt(M) if kw.pop("outer_lr_over_sqrt_m", False) else 0.7
    batch = args.global_batch - args.global_batch % M  # a multiple of M (M = 3: 15 sequences of 16)
    cfg = TrainConfig.from_dict(
        {
            **load_preset("tiny")["base"],
            "method": "decoupled",
            "replicas": M,
            "quorum": kw.pop("quorum") or 0,
            **kw,
            "size": args.size,
            "seq_len": args.seq_len,
            "global_batch": batch,
            "inner_lr": args.inner_lr,
            "steps": args.steps,
            "warmup_steps": args.steps // 10,
            "min_lr_ratio": 0.1,
            "sync_every": args.sync_every,
            "num_fragments": args.fragments,
            "overlap_steps": args.overlap,
            "outer_lr": outer_lr,
            "step_time": args.step_time,
            "eval_every": args.steps,
            "eval_batches": 16,
            "threads": 1,
            **({} if seed is None else {"seed": seed}),
        }
    )
    out = work / (f"{method}-m{M}-{fault}" + ("" if seed is None else f"-s{seed}"))
    head = {"method": method, "M": M, "fault": fault, **({} if seed is None else {"seed": seed})}
    head |= {} if batch == args.global_batch else {"global_batch": batch}
    if method in THREADS:
        assert fault in ("none", "straggler"), fault  # threads take no injected fault
        slowdown = faults(fault, M).slowdown or (1.0,) * M
        return (
            head
            | {"loop": "trainer (threads)"}
            | threads_run(cfg, out=out, cache=default_cache_dir(), slowdown=slowdown)
        )
    shutil.rmtree(out, ignore_errors=True)
    res = run_on_ray(
        cfg,
        out_dir=out,
        cache_dir=default_cache_dir(),
        chaos=faults(fault, M),
        max_seconds=args.steps * args.step_time * 6 + 120,
        total_tokens=args.steps * batch * args.seq_len,
    )
    s = res.summary
    versions: dict[int, list[int]] = {}
    for r in res.merges:
        versions.setdefault(int(r["fragment"]), []).append(int(r["version"]))
    return head | {
        "loop": "trainer",  # learners run the trainer (site jobs); rows without it: the earlier plain loop
        "eval_loss": res.eval_loss,
        "wall_s": res.wall_s,
        "goodput": s["goodput"],
        "lost_steps": s["lost_steps"],
        "merges": s["merges"],
        "wait_share": s.get("wait_share"),
        "steps": {str(m): sum(1 for r in res.rows if r.get("learner") == m and "step" in r) for m in range(M)},
        "kills": s["learner_kills"],
        "corrupted_reports": s["corrupted_reports"],
        "guard_events": len(s["guard_events"]),
        "syncer_kills": s["syncer_kills"],
        # no merge lost: each fragment's versions run without a gap
        "versions_contiguous": all(sorted(v) == list(range(min(v), min(v) + len(v))) for v in versions.values()),
    }


def dp_row(args, cache: Path) -> dict:
    """Data-parallel on the same model, global batch, tokens and schedule shape, through ``diloco train``."""
    from diloco.train.trainer import train_model

    base = load_preset("tiny")["base"]
    cfg = TrainConfig.from_dict(
        {
            **base,
            "method": "dp",
            "replicas": 1,
            "size": args.size,
            "seq_len": args.seq_len,
            "global_batch": args.global_batch,
            "inner_lr": args.inner_lr,
            "steps": args.steps,
            "tokens": 0,
            "warmup_steps": args.steps // 10,
            "min_lr_ratio": 0.1,
            "eval_every": args.steps,
            "eval_batches": 16,
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.time()
        result = train_model(cfg, Path(tmp) / "dp", cache_dir=cache, progress=False)
    return {
        "method": "dp",
        "M": 1,
        "fault": "none",
        "eval_loss": result.final_eval_loss,
        "wall_s": time.time() - t0,
        "goodput": None,
        "merges": None,
        "kills": [],
    }


Plan = tuple[str, int, str, "int | None"]  # method, M, fault, seed (None: the preset's, unnamed in the row)


def key(r: dict) -> Plan:
    return (r["method"], r["M"], r["fault"], r.get("seed"))


SEEDS = (0, 1, 2)  # --trainer: the defaults without faults and with the syncer killed


def trainer_plan(Ms: list[int]) -> list[Plan]:
    """``--trainer``: today's defaults without faults and with the syncer SIGKILLed (ride-out on), 3 seeds each;
    late reports merged alone; K = M // 2 with ``next`` and ``alone``; a 3x straggler at K = 1 with the token
    budget shared, with each learner's own steps, and at K = M; then K = 2 of 3 with ``next`` and ``alone``."""
    out: list[Plan] = []
    for M in Ms:
        out += [("decoupled-default", M, "none", s) for s in SEEDS]
        out += [("decoupled-rideout", M, "syncer-kill", s) for s in SEEDS]
        out += [("decoupled-alone", M, "none", 0)]
        out += [(m, M, "none", 0) for m in ("decoupled-khalf", "decoupled-khalf-alone") if M // 2 > 1]
        out += [(m, M, "straggler", 0) for m in ("decoupled-k=m-default", "decoupled-default")]
        out += [(m, M, "straggler", 0) for m in ("threads-tokens", "threads-k=m")]
    return out + [(m, 3, "none", 0) for m in ("decoupled-k2", "decoupled-k2-alone")]


def plan_of(args, Ms: list[int]) -> list[Plan]:
    """The runs, in the table's order (the contribution guard's 5 with ``--guard``, the trainer loop's with
    ``--trainer``)."""
    if args.trainer:
        return trainer_plan(Ms)
    if args.guard:
        return [
            ("decoupled-k=m", 3, "none", None),
            ("decoupled-k=m", 3, "corrupt", None),
            ("decoupled-k=m-noguard", 3, "corrupt", None),
            ("decoupled-k=m", 3, "corrupt-random", None),
            ("decoupled-k=m-noguard", 3, "corrupt-random", None),
        ]
    return [
        (m, M, f, None)
        for M in Ms
        for m, f in [
            ("dp", "none"),
            ("dp", "kill"),
            ("dp", "straggler"),
            ("dp-ckpt16", "none"),
            ("dp-ckpt16", "kill"),
            ("torchft", "none"),
            ("torchft", "kill"),
            ("sync", "none"),
            ("decoupled", "none"),
            ("decoupled-mean", "none"),
            ("sync", "kill"),
            ("decoupled", "kill"),
            ("sync", "straggler"),
            ("decoupled", "straggler"),
            ("decoupled-mean", "straggler"),
            ("decoupled-own", "straggler"),
            ("decoupled-mean-own", "straggler"),
            ("decoupled-own-scaled", "none"),
            ("decoupled-own-scaled", "kill"),
            ("decoupled-own-scaled", "straggler"),
            ("decoupled-lr-sqrtm", "none"),
            ("decoupled-lr-sqrtm", "kill"),
            ("decoupled-lr-sqrtm", "straggler"),
            ("decoupled-default", "none"),
            ("decoupled-default", "straggler"),
            ("decoupled-mean-default", "none"),
            ("decoupled-mean-default", "straggler"),
        ]
    ]


def measure(args, todo: list[Plan], done: dict, runs_file: Path) -> None:
    """Run ``todo``, appending each finished run to ``runs_file`` (and to ``done``); then data-parallel in one
    process without faults, if not there yet."""
    base = TrainConfig.from_dict(load_preset("tiny")["base"])
    cache = default_cache_dir()
    data = prepare_tokens(base.sources, base.vocab_size, cache, val_fraction=base.val_fraction)
    work = Path(tempfile.mkdtemp(prefix="diloco-chaos-"))
    if any(m not in DP_METHODS and m != "torchft" for m, _, _, _ in todo):
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="diloco-chaos")
    try:
        for i, (method, M, fault, seed) in enumerate(todo, 1):
            print(f"[{i}/{len(todo)}] {method} M={M} faults={fault} seed={seed} ...", file=sys.stderr, flush=True)
            if method in DP_METHODS:
                row = dp_run(
                    M=M,
                    fault=fault,
                    args=args,
                    work=work,
                    cache=cache,
                    method=method,
                    checkpoint_every=DP_METHODS[method],
                )
            elif method == "torchft":
                row = torchft_run(M=M, fault=fault, args=args, data=data, work=work)
            else:
                row = one_run(method=method, M=M, fault=fault, args=args, data=data, work=work, seed=seed)
            with open(runs_file, "a") as fh:
                fh.write(json.dumps(row, allow_nan=False) + "\n")
            done[key(row)] = row
    finally:
        if ray.is_initialized():
            ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    if not (args.guard or args.trainer) and ("dp", 1, "none", None) not in done:
        done[("dp", 1, "none", None)] = row = dp_row(args, cache)
        with open(runs_file, "a") as fh:
            fh.write(json.dumps(row, allow_nan=False) + "\n")


def print_trainer_summary(rows: list[dict], Ms: list[int]) -> None:
    """The syncer kill's final loss against the same defaults without it, paired by seed."""
    for M in Ms:
        d = paired_difference(rows, base=("decoupled-default", "none"), other=("decoupled-rideout", "syncer-kill"), M=M)
        if d is not None:
            mean, se, n = d
            print(
                f"\nM = {M}: the syncer killed (ride-out on) minus the defaults without it: final loss {mean:+.4f}"
                + (f" ± {se:.4f} (s.e., {n} seeds)" if se is not None else " (1 seed)")
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_quick(ap, "M = 2 only, 120 steps")
    ap.add_argument(
        "--guard",
        action="store_true",
        help="only the contribution guard's rows: M = 3, K = M, no fault, "
        "learner 1 corrupted (1e4 x, or random values) from 10 s to 15 s with the guard, and without it",
    )
    ap.add_argument(
        "--trainer",
        action="store_true",
        help="only the trainer loop's rows (M = 4): defaults, the syncer killed, late_reports=alone, K = M/2, "
        "a straggler with learner_budget=tokens; K = 2 of 3 with late_reports next and alone",
    )
    ap.add_argument("--fresh", action="store_true", help="start a new runs file (the old one is kept, renamed)")
    ap.add_argument(
        "--rerun",
        default="",
        help="methods to run again (comma-separated; their new rows are appended and supersede the old ones)",
    )
    ap.add_argument("--replicas", default=None, help="the values of M, comma-separated (default 2,4; 4 with --trainer)")
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--steps", type=int, default=300, help="steps per learner that reach the syncer")
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--inner-lr", type=float, default=3e-3)
    ap.add_argument("--sync-every", type=int, default=16)
    ap.add_argument("--fragments", type=int, default=2)
    ap.add_argument("--overlap", type=int, default=2)
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument(
        "--report",
        action="store_true",
        help="run nothing: the table and the JSON again from the runs file (settings and versions kept from the "
        "JSON there, if any, and its M values unless --replicas is given)",
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON result (default: benchmarks/results/chaos.json; chaos-quick.json with --quick, chaos-guard.json "
        "with --guard, chaos-trainer.json with --trainer)",
    )
    args = ap.parse_args()
    if args.quick:
        args.replicas, args.steps = "2", 120
    if args.guard:
        args.replicas = "3"
    suffix = "-guard" if args.guard else "-trainer" if args.trainer else "-quick" if args.quick else ""
    stored = result_path(f"chaos{suffix}")
    if args.replicas is None and args.report and stored.exists():  # the table's M values: those measured
        args.replicas = json.loads(stored.read_text())["settings"]["replicas"]
    if args.replicas is None:
        args.replicas = "4" if args.trainer else "2,4"
    Ms = [int(m) for m in args.replicas.split(",")]
    RESULTS.mkdir(exist_ok=True)
    runs_file = RESULTS / f"chaos-runs{suffix}.jsonl"
    if args.fresh and not args.report and runs_file.exists():
        runs_file.rename(runs_file.with_suffix(f".{int(time.time())}.jsonl"))
    done = {key(r): r for r in (read_jsonl(runs_file) if runs_file.exists() else [])}
    plan = plan_of(args, Ms)
    if not args.report:
        rerun = {m for m in args.rerun.split(",") if m}
        measure(args, [p for p in plan if p not in done or p[0] in rerun], done, runs_file)

    order = ([] if args.guard or args.trainer else [("dp", 1, "none", None)]) + plan
    missing = [p for p in order if p not in done]
    if missing:  # only with --report: a measurement ends with every row of its plan
        print(f"not in {runs_file} yet (left out): {', '.join(f'{m} M={M} {f}' for m, M, f, _ in missing)}")
    rows = [done[p] for p in order if p in done]
    print()
    print_table(rows, columns_for(rows))
    if args.trainer:
        print_trainer_summary(rows, Ms)
    peer_file = RESULTS / "torchft_healing.json"
    peer = json.loads(peer_file.read_text()) if peer_file.exists() and not args.trainer else None
    if peer is not None:
        sv, rs = peer["median"]["survivor"], peer["median"]["restarted"]
        print(
            f"\ntorchft 0.2.0 DiLoCo, live healing, M = 2 (benchmarks/torchft_healing.py, median of "
            f"{len(peer['repeats'])}): survivor's stall at its next sync {sv['stall_s']:.2f} s "
            f"({sv['stall_ratio']:.1f}x its step), steps kept in 10 s {sv['kept_pct']:.0f} %; the restart "
            f"(3 s after the kill) contributes {rs['contributes_s']:.1f} s after it was spawned"
        )
    settings = {k: v for k, v in vars(args).items() if k not in ("report", "out")}
    out = {"settings": settings, "runs": rows, "torchft": peer, "torch": torch.__version__, "ray": ray.__version__}
    if args.report and stored.exists():  # the runs were measured with these, not with this process's
        kept = json.loads(stored.read_text())
        out |= {k: kept[k] for k in ("settings", "torch", "ray") if k in kept}
    write_result(f"chaos{suffix}", out, out=args.out)


if __name__ == "__main__":
    main()
