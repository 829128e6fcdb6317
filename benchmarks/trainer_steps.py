"""What does the trainer add to each step, paired step by step with a bare loop in one process?

``benchmarks/throughput.py`` compares whole runs; on a shared machine the other work moves a run's wall clock
by far more than the 5 % it is meant to resolve. Here a bare step and a trainer step alternate (bare, trainer;
then trainer, bare), each on its own model of the demo size (cpu-1m, vocab 4096, batch 16 x 128, DiLoCo M=1,
H = 6), so a busy neighbour hits both members of a pair alike. Each step is timed by the wall clock and by this
thread's CPU time (``--threads 1``, the default: then the CPU time is all the step's work). A second bare
loop on its own model (the control) runs in the rotation too: its extra over the first is what this
measurement cannot tell from zero (memory placement, cache, the order within a step).

  * bare step: next batch, forward, backward, clip, AdamW step, zero_grad;
  * trainer step: what the trainer's loop does per step (:mod:`diloco.train.trainer`): ``train_step`` (the
    learning rate, the batch, forward/backward, clip, the inner step, the algorithm's syncs, ``loss.item()``),
    ``step_record`` and ``StepTable.add`` (the merged row, its JSONL line written and flushed),
    ``check_training_loss``.

The three run in turn each step (bare, control, trainer; then trainer, bare, control; ...). Per step (the
first left out: it holds the warm-up), the trainer's extra time over the bare step; the median over the
steps without a sync is the trainer's own per-step work, the median over the sync steps (every H-th) the
algorithm's sync, shared by H steps. Implied ratio = bare step / (bare step + own extra + sync extra / H).
The control's extra (median over the same steps) is printed beside it.

    .venv/bin/python benchmarks/trainer_steps.py            # ~3 min at 1 thread; results/trainer_steps.json
    .venv/bin/python benchmarks/trainer_steps.py --quick
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from diloco.bench import add_out, add_quick, machine, write_result
from diloco.comm.local import LocalGroup
from diloco.data import ShardSampler
from diloco.files import default_cache_dir
from diloco.models.factory import build_model
from diloco.train.config import TrainConfig, load_preset
from diloco.train.divergence import check_training_loss
from diloco.train.inner_step import step_record, train_step
from diloco.train.inputs import prepare_inputs
from diloco.train.metrics import JSONLSink
from diloco.train.replica import Run, build_replica
from diloco.train.speed import tcmalloc_loaded
from diloco.train.step_log import StepTable

CPU = torch.device("cpu")


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def measure(cfg: TrainConfig, cache: Path, run_dir: Path) -> dict[str, list]:
    """Per step: (wall, cpu) of the bare step, the control's and the trainer's, and whether the trainer's synced."""
    inputs = prepare_inputs(cfg, cache)
    run = Run(
        data=inputs.data,
        val=inputs.val_batches,
        template=inputs.model,
        fragments=inputs.fragments,
        start_step=0,
        wall_before=0.0,
        t0=time.perf_counter(),
    )
    rep = build_replica(cfg, LocalGroup(1).communicators[0], None, run, device=CPU)
    sink = JSONLSink(run_dir / "metrics.jsonl")
    table = StepTable(1, sink, lambda row: None)

    def trainer(step: int) -> bool:
        out = train_step(rep, step, cfg=cfg, device=CPU)
        table.add(rep.rank, step, step_record(rep, step, out))
        check_training_loss(out.loss, step=step, replica=rep.rank, cfg=cfg)
        return bool(out.synced_fragments)

    steps = {"bare": bare_steps(cfg, inputs.data), "control": bare_steps(cfg, inputs.data), "trainer": trainer}
    names = list(steps)
    times: dict[str, list] = {**{name: [] for name in names}, "synced": []}
    for step in range(1, cfg.total_steps + 1):
        k = step % len(names)
        for name in names[k:] + names[:k]:
            t0 = _clocks()
            synced = steps[name](step)
            t1 = _clocks()
            times[name].append((t1[0] - t0[0], t1[1] - t0[1]))
            if name == "trainer":
                times["synced"].append(synced)
    sink.close()
    return times


def bare_steps(cfg: TrainConfig, data) -> Callable[[int], bool]:
    """One bare step a call, of a model of its own (seeded as the trainer's) on the trainer's batches."""
    model = build_model(
        cfg.model, size=cfg.size, vocab_size=data.vocab_size, seq_len=cfg.seq_len, seed=cfg.seed, z_loss=cfg.z_loss
    )
    opt = torch.optim.AdamW(
        model.parameters(), lr=cfg.inner_lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay
    )
    sampler = ShardSampler(
        data.train, rank=0, world_size=1, batch_size=cfg.global_batch, seq_len=cfg.seq_len, seed=cfg.seed
    )

    def bare(step: int) -> bool:
        x, y = sampler.next_batch()
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return False

    return bare


def summary(times: dict[str, list], clock: int, sync_every: int) -> dict[str, float]:
    """Medians (seconds) of one clock (0: wall, 1: CPU) over the pairs after the first, and the implied ratio."""
    pairs = list(zip(times["bare"], times["trainer"], times["synced"], times["control"]))[1:]
    bare = statistics.median(b[clock] for b, _, _, _ in pairs)
    own = [t[clock] - b[clock] for b, t, s, _ in pairs if not s]
    sync = [t[clock] - b[clock] for b, t, s, _ in pairs if s]
    control = [c[clock] - b[clock] for b, _, s, c in pairs if not s]
    own_extra = statistics.median(own)
    sync_extra = statistics.median(sync) if sync else 0.0
    return {
        "bare_step_s": bare,
        "trainer_step_s": statistics.median(t[clock] for _, t, s, _ in pairs if not s),
        "control_extra_s": statistics.median(control),
        "own_extra_s": own_extra,
        "sync_extra_s": sync_extra,
        "pairs_without_sync": len(own),
        "pairs_with_sync": len(sync),
        "implied_ratio": bare / (bare + own_extra + sync_extra / sync_every),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=61, help="steps of each (the first pair is left out)")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (at 1, a step's thread CPU time is all of it)"
    )
    ap.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    add_out(ap, "trainer_steps")
    add_quick(ap, "13 steps")
    args = ap.parse_args()
    if args.quick:
        args.steps = 13
    preset = load_preset("demo")["base"]
    if args.steps < preset["sync_every"] + 1 or args.threads < 1:
        ap.error(f"--steps {args.steps} --threads {args.threads}: need steps > {preset['sync_every']} and threads >= 1")
    cfg = TrainConfig.from_dict(
        {**preset, "replicas": 1, "steps": args.steps, "warmup_steps": 5, "eval_batches": 1, "threads": args.threads}
    )
    torch.set_num_threads(args.threads)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        times = measure(cfg, args.cache_dir, Path(d))
    clocks = {"wall": summary(times, 0, cfg.sync_every), "cpu": summary(times, 1, cfg.sync_every)}
    print(f"{cfg.total_steps} step pairs (first left out), {args.threads} thread(s), H = {cfg.sync_every}")
    print(
        f"{'clock':<5} {'bare ms':>8} {'trainer ms':>10} {'own extra':>10} {'sync extra':>11} {'implied ratio':>14}"
        f" {'control extra':>14}"
    )
    for name, c in clocks.items():
        print(
            f"{name:<5} {c['bare_step_s'] * 1e3:8.1f} {c['trainer_step_s'] * 1e3:10.1f} "
            f"{c['own_extra_s'] * 1e3:+9.2f}ms {c['sync_extra_s'] * 1e3:+9.2f}ms {c['implied_ratio']:14.4f}"
            f" {c['control_extra_s'] * 1e3:+12.2f}ms"
        )
    after = os.getloadavg()
    print(f"load average before {load[0]:.2f}, after {after[0]:.2f} ({os.cpu_count()} cores)")
    write_result(
        "trainer_steps",
        {
            "clocks": clocks,
            "steps": cfg.total_steps,
            "threads": args.threads,
            "sync_every": cfg.sync_every,
            "step_times_s": {k: times[k] for k in ("bare", "control", "trainer")},
            "synced": times["synced"],
            "load_1min_before": load[0],
            "load_1min_after": after[0],
            "ld_preload": os.environ.get("LD_PRELOAD", ""),
            "tcmalloc_loaded": tcmalloc_loaded(),
            "machine": machine(),
            "torch": torch.__version__,
        },
        out=args.out,
    )


if __name__ == "__main__":
    main()
