"""Does the trainer waste the machine, and how much do its speed options give?

``--part overhead`` (the default), at the demo size (cpu-1m, vocab 4096, global batch 16 x 128):
  * bare loop: one model, AdamW, the same batches, nothing else;
  * trainer, DiLoCo M=1 (the wrapper, logging, data pipeline): goal >= 0.95x the bare loop's tokens/s;
  * trainer, DP M=2 and DiLoCo M=2 (two replica threads of batch 8): goal DiLoCo <= 1.05x DP's time.

Each round runs every configuration once, the order reversed every other round (bare, trainer, DP, DiLoCo;
then DiLoCo, DP, trainer, bare), all at the torch thread count chosen at the round's start (``--threads``, or
the trainer's own default for one replica then: the cores no other work keeps busy; M=2 gets half each), so
no configuration gets more cores than the other. The headline figures are the medians of the per-round
ratios: a machine that drifts between rounds (this one is shared) moves neither. Tokens/s is wall clock over
steps 1..N-1: the bare loop's, and the trainer's loop with everything it does per step (its step, the
algorithm's syncs, the metrics row and its JSONL line, the checks and callbacks); its step N also evaluates
and writes the final checkpoint, which a bare loop has no counterpart of. Beside it: the same ratio by
the training thread's CPU time (the work done, whoever else shares the cores; at 1 thread, all of it) and by
the trainer's own clock (``train_time_s``: the inner steps alone). ``--m1-only``: the bare loop and
DiLoCo M=1 alone (the headline ratio, in half the time).

``--part levers``: the trainer (DiLoCo M=1, the demo's batch) with ``bf16`` autocast and/or
``compile`` (torch.compile) against fp32 eager, at each ``--sizes`` (default cpu-1m and cpu-10m).
Tokens/s of the steady state (the first ``--skip`` steps, which hold the compilation, are left
out); the final eval loss of each run beside it, round r using seed r, so the fp32 runs' spread over
seeds is the noise the other losses are compared with. Goals: bf16 + compile >= 1.4x fp32 at
cpu-1m and >= 1.8x at cpu-10m, with tcmalloc preloaded in both. Configurations alternate over
rounds; its speed-ups are ratios of medians.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 .venv/bin/python benchmarks/throughput.py
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 .venv/bin/python benchmarks/throughput.py \
        --m1-only --steps 30 --rounds 5
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 .venv/bin/python benchmarks/throughput.py \
        --part levers --rounds 2

Prints a table and writes benchmarks/results/throughput.json (``--part levers``: throughput_levers.json).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from diloco.bench import add_quick, machine, round_ratios, summarize, write_result
from diloco.data import ShardSampler, prepare_tokens
from diloco.files import default_cache_dir, read_jsonl
from diloco.models.factory import build_model
from diloco.train.callbacks import TrainerCallback
from diloco.train.config import TrainConfig, load_preset
from diloco.train.speed import tcmalloc_loaded
from diloco.train.threads import default_threads
from diloco.train.trainer import Trainer

LEVERS = {
    "fp32": {},
    "bf16": {"bf16": True},
    "compile": {"compile": True},
    "bf16+compile": {"bf16": True, "compile": True},
}


BARE = "bare loop (1 model, batch 16)"
M1 = "trainer DiLoCo M=1"
DP = "trainer DP M=2"
M2 = "trainer DiLoCo M=2"


def bare_loop(cfg: TrainConfig, data, steps: int, threads: int) -> tuple[float, float]:
    """Tokens/s of ``steps`` steps of one model on the global batch at ``threads`` torch threads: (by the wall clock,
    by this thread's CPU time)."""
    torch.set_num_threads(threads)
    model = build_model(
        cfg.model,
        size=cfg.size,
        vocab_size=data.tokenizer.vocab_size,
        seq_len=cfg.seq_len,
        seed=cfg.seed,
        z_loss=cfg.z_loss,
    )
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.inner_lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay
    )
    sampler = ShardSampler(
        data.train, rank=0, world_size=1, batch_size=cfg.global_batch, seq_len=cfg.seq_len, seed=cfg.seed
    )
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(steps):
        x, y = sampler.next_batch()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return steps * cfg.tokens_per_step / wall, steps * cfg.tokens_per_step / cpu


class LoopClock(TrainerCallback):
    """Replica 0's loop from its start (the replica built) to the end of step ``until``: its wall clock and its
    thread's CPU time (both hooks run in replica 0's thread)."""

    def __init__(self, until: int) -> None:
        self.until = until
        self.start: tuple[float, float] | None = None
        self.end: tuple[float, float] | None = None

    def on_replica_start(self, algo, *, replica: int, step: int) -> None:
        if replica == 0:
            self.start = (time.perf_counter(), time.thread_time())

    def on_step_end(self, step: int, *, rank: int) -> None:
        if rank == 0 and step == self.until:
            self.end = (time.perf_counter(), time.thread_time())


def trainer_run(cfg: TrainConfig, cache: Path) -> tuple[float, float, float]:
    """Tokens/s of the loop over steps 1..N-1 (by the wall clock, by replica 0's thread CPU time), and by the
    trainer's own clock (``train_time_s``: its inner steps alone, all N)."""
    clock = LoopClock(cfg.total_steps - 1)
    with tempfile.TemporaryDirectory() as d:
        result = Trainer(cfg, Path(d), cache_dir=cache, progress=False, callbacks=[clock]).run()
    assert clock.start is not None and clock.end is not None, "the loop clock missed the loop"
    tokens = clock.until * cfg.tokens_per_step
    wall, cpu = clock.end[0] - clock.start[0], clock.end[1] - clock.start[1]
    return tokens / wall, tokens / cpu, result.tokens / result.train_time_s


def lever_run(cfg: TrainConfig, cache: Path, skip: int) -> tuple[float, float]:
    """(steady-state tokens/s after the first ``skip`` steps, final eval loss) of one trainer run."""
    with tempfile.TemporaryDirectory() as d:
        result = Trainer(cfg, Path(d), cache_dir=cache, progress=False).run()
        rows = [r for r in read_jsonl(Path(d) / "metrics.jsonl") if "loss" in r and r["step"] > skip]
    return sum(r["tokens"] for r in rows) / sum(r["step_time_s"] for r in rows), result.final_eval_loss


def levers(args: argparse.Namespace) -> None:
    preset = load_preset("demo")
    threads = os.cpu_count() or 1
    out: dict = {
        "sizes": {},
        "rounds": args.rounds,
        "skip": args.skip,
        "threads": threads,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "tcmalloc_loaded": tcmalloc_loaded(),
        "torch": torch.__version__,
    }
    for size, steps in zip(args.sizes, args.lever_steps):
        base = TrainConfig.from_dict(
            {
                **preset["base"],
                "size": size,
                "replicas": 1,
                "steps": steps,
                "eval_every": steps,
                "eval_batches": 8,
                "warmup_steps": min(30, steps // 4),
                "checkpoint_every": 0,
                "threads": threads,
            }
        )
        prepare_tokens(base.sources, base.vocab_size, args.cache_dir, val_fraction=base.val_fraction)
        tps: dict[str, list[float]] = {k: [] for k in LEVERS}
        loss: dict[str, list[float]] = {k: [] for k in LEVERS}
        for r in range(args.rounds):
            for name, kw in LEVERS.items():
                t, final = lever_run(base.with_overrides({**kw, "seed": r}), args.cache_dir, args.skip)
                tps[name].append(t)
                loss[name].append(final)
            print(
                f"{size} round {r + 1}/{args.rounds} (seed {r}): "
                + ", ".join(f"{k}: {tps[k][-1]:.0f} tok/s, loss {loss[k][-1]:.4f}" for k in LEVERS),
                flush=True,
            )
        fp32 = summarize(tps["fp32"]).median
        rows = []
        for name in LEVERS:
            # the loss against fp32's of the same seed: the lever's effect; fp32's spread over seeds: the noise
            dl = [a - b for a, b in zip(loss[name], loss["fp32"])]
            rows.append(
                {
                    "config": name,
                    "tokens_per_s": summarize(tps[name]).median,
                    "tokens_per_s_rounds": tps[name],
                    "speedup": summarize(tps[name]).median / fp32,
                    "final_eval_loss": loss[name],
                    "loss_minus_fp32_same_seed": dl,
                }
            )
        noise = max(loss["fp32"]) - min(loss["fp32"]) if args.rounds > 1 else None
        out["sizes"][size] = {
            "steps": steps,
            "tokens_per_step": base.tokens_per_step,
            "rows": rows,
            "fp32_loss_spread_over_seeds": noise,
        }
        print(
            f"\n{size}: {steps} steps of {base.tokens_per_step} tokens, {threads} threads, "
            f"medians of {args.rounds} rounds"
        )
        print(
            f"{'config':<14} {'tokens/s':>9} {'speedup':>8} {'final eval loss (seed 0..)':>28} {'vs fp32, same seed':>20}"
        )
        for row in rows:
            print(
                f"{row['config']:<14} {row['tokens_per_s']:9.0f} {row['speedup']:8.3f} "
                f"{' '.join(f'{v:.4f}' for v in row['final_eval_loss']):>28} "
                f"{' '.join(f'{v:+.4f}' for v in row['loss_minus_fp32_same_seed']):>20}"
            )
        if noise is not None:
            print(f"noise: fp32's final eval loss spread over seeds {noise:.4f}")
    print(f"LD_PRELOAD={out['ld_preload']!r}; tcmalloc loaded: {out['tcmalloc_loaded']}")
    path = args.out.with_name("throughput_levers.json") if args.out.name == "throughput.json" else args.out
    write_result("throughput_levers", out, out=path)


def overhead(args: argparse.Namespace) -> None:
    preset = load_preset("demo")
    base = TrainConfig.from_dict(
        {**preset["base"], "steps": args.steps, "eval_every": 10 * args.steps, "eval_batches": 1, "warmup_steps": 5}
    )
    data = prepare_tokens(base.sources, base.vocab_size, args.cache_dir, val_fraction=base.val_fraction)
    timed = args.steps - 1  # steps 1..N-1 of every configuration (the trainer's step N evaluates and checkpoints)

    def trainer(overrides: dict, threads: int):
        return lambda: trainer_run(base.with_overrides({**overrides, "threads": threads}), args.cache_dir)

    rounds: list[dict] = []
    for r in range(args.rounds):
        threads = args.threads or default_threads(1)  # this round's cores, the same for every configuration
        runs = {
            BARE: lambda: (*bare_loop(base, data, timed, threads), None),
            M1: trainer({"replicas": 1}, threads),
        }
        if not args.m1_only:
            runs[DP] = trainer({"method": "dp"}, max(1, threads // 2))
            runs[M2] = trainer({}, max(1, threads // 2))
        order = list(runs) if r % 2 == 0 else list(runs)[::-1]
        load = os.getloadavg()[0]
        measured = {name: runs[name]() for name in order}
        rnd = {
            "order": order,
            "threads": threads,
            "load_1min_before": load,
            "load_1min_after": os.getloadavg()[0],
            "tokens_per_s": {k: measured[k][0] for k in runs},
            "tokens_per_cpu_s": {k: measured[k][1] for k in runs},
            "tokens_per_s_train_time": {k: measured[k][2] for k in runs if measured[k][2] is not None},
        }
        tps = rnd["tokens_per_s"]
        rnd["trainer_vs_bare"] = tps[M1] / tps[BARE]
        rnd["trainer_vs_bare_cpu"] = rnd["tokens_per_cpu_s"][M1] / rnd["tokens_per_cpu_s"][BARE]
        if not args.m1_only:
            rnd["diloco_vs_dp_time"] = tps[DP] / tps[M2]  # time(DiLoCo) / time(DP), same tokens
        rounds.append(rnd)
        print(
            f"round {r + 1}/{args.rounds} ({threads} threads, load {load:.1f}): "
            + ", ".join(f"{k}: {tps[k]:.0f}" for k in runs)
            + f"; trainer/bare {rnd['trainer_vs_bare']:.3f} (thread CPU: {rnd['trainer_vs_bare_cpu']:.3f})"
            + ("" if args.m1_only else f", DiLoCo/DP time {rnd['diloco_vs_dp_time']:.3f}"),
            flush=True,
        )
    names = list(rounds[0]["tokens_per_s"])
    per = {k: [rnd["tokens_per_s"][k] for rnd in rounds] for k in names}
    rows = []
    for k in names:
        vs_rounds, vs_bare = round_ratios(per[k], per[BARE])
        rows.append(
            {"run": k, "tokens_per_s": summarize(per[k]).median, "vs_bare": vs_bare, "vs_bare_rounds": vs_rounds}
        )
    m1_rounds, ratio_m1 = round_ratios(per[M1], per[BARE])
    own_rounds, ratio_own = round_ratios(
        [rnd["tokens_per_s_train_time"][M1] for rnd in rounds], [rnd["tokens_per_s"][BARE] for rnd in rounds]
    )
    print(f"\n{'run':<32} {'tokens/s':>9} {'vs bare':>8}   (medians; vs bare: median of the per-round ratios)")
    for row in rows:
        print(f"{row['run']:<32} {row['tokens_per_s']:9.0f} {row['vs_bare']:8.3f}")
    print(f"\ntrainer (DiLoCo M=1) / bare loop tokens/s, per round: {' '.join(f'{v:.3f}' for v in m1_rounds)}")
    print(f"median of {len(m1_rounds)} rounds: {ratio_m1:.3f}  (goal >= 0.95)")
    cpu_rounds, ratio_cpu = round_ratios(
        [rnd["tokens_per_cpu_s"][M1] for rnd in rounds], [rnd["tokens_per_cpu_s"][BARE] for rnd in rounds]
    )
    print(f"by the trainer's own clock (train_time_s, its inner steps alone): {ratio_own:.3f}")
    print(f"by the training thread's CPU time (the work, whoever else runs; 1 thread: all of it): {ratio_cpu:.3f}")
    result = {
        "rows": rows,
        "trainer_vs_bare": ratio_m1,
        "trainer_vs_bare_rounds": m1_rounds,
        "trainer_vs_bare_train_time": ratio_own,
        "trainer_vs_bare_train_time_rounds": own_rounds,
        "trainer_vs_bare_cpu": ratio_cpu,
        "trainer_vs_bare_cpu_rounds": cpu_rounds,
        "measure": "wall-clock tokens/s over steps 1..N-1; headline: median of per-round ratios",
        "steps": args.steps,
        "rounds": args.rounds,
        "round_results": rounds,
        "m1_only": args.m1_only,
        "ld_preload": os.environ.get("LD_PRELOAD", ""),
        "tcmalloc_loaded": tcmalloc_loaded(),
        "machine": machine(),
        "torch": torch.__version__,
    }
    if not args.m1_only:
        dp_rounds, time_ratio = round_ratios(per[DP], per[M2])
        result |= {"diloco_vs_dp_time": time_ratio, "diloco_vs_dp_time_rounds": dp_rounds}
        print(f"DiLoCo M=2 time / DP M=2 time, same tokens, per round: {' '.join(f'{v:.3f}' for v in dp_rounds)}")
        print(f"median: {time_ratio:.3f}  (goal <= 1.05)")
    print(f"LD_PRELOAD={result['ld_preload']!r}; tcmalloc loaded: {result['tcmalloc_loaded']}")
    write_result("throughput", result, out=args.out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("overhead", "levers"), default="overhead")
    ap.add_argument("--steps", type=int, default=60, help="--part overhead: steps per run (>= 2)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--threads", type=int, default=0, help="--part overhead: torch threads (0: the trainer's default, each round)"
    )
    ap.add_argument("--m1-only", action="store_true", help="--part overhead: the bare loop and DiLoCo M=1 alone")
    ap.add_argument("--sizes", nargs="+", default=["cpu-1m", "cpu-10m"], help="--part levers: model sizes")
    ap.add_argument(
        "--lever-steps", type=int, nargs="+", default=[150, 40], help="--part levers: steps per run, one per size"
    )
    ap.add_argument("--skip", type=int, default=5, help="--part levers: first steps left out of tokens/s")
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "throughput.json")
    add_quick(ap, "overhead: 6 steps, 2 rounds, M=1 only; levers: cpu-1m, 8 steps, 1 round")
    args = ap.parse_args()
    if args.quick and args.part == "levers":
        args.sizes, args.lever_steps, args.skip, args.rounds = ["cpu-1m"], [8], 2, 1
    elif args.quick:
        args.steps, args.rounds, args.m1_only = 6, 2, True
    if args.rounds < 1 or args.threads < 0:
        ap.error(f"--rounds {args.rounds} --threads {args.threads}: need rounds >= 1 and threads >= 0 (0: auto)")
    if args.part == "levers":
        if len(args.lever_steps) != len(args.sizes):
            ap.error(f"--lever-steps {args.lever_steps}: give one step count per size {args.sizes}")
        levers(args)
        return
    if args.steps < 2:
        ap.error(f"--steps {args.steps}: need >= 2 (steps 1..N-1 are timed)")
    overhead(args)


if __name__ == "__main__":
    main()
