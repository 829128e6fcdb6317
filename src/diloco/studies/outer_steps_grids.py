"""The outer step at the best batch: H and outer momentum bracketed per batch, on one CUDA GPU (the grids of
studies/outer-steps, written by its grids.py):

    .venv/bin/python studies/outer-steps/grids.py 1          # the first stage: writes grids/*.json, prints their paths
    .venv/bin/python studies/outer-steps/grids.py 2 RESULTS  # the second, read off the first stage's records
    .venv/bin/python studies/outer-steps/grids.py 3 RESULTS  # the third: seeds at an outer lr that beat 0.7
    .venv/bin/python studies/outer-steps/grids.py 4          # the fourth, written from the first two's results

Every run is a run of the frontier's GPU grids (studies/frontier/gpu_grids.py: ``cpu-1m``, 20 tokens per
parameter, the corpus's token files, bf16 + torch.compile, one thread, warmup 120) at its frontier-best inner lr
(1.6e-2 at batch 64 and 128, for DP and Streaming alike), so its gap is read against the frontier's DP records on
the same device. What changes is the outer step: H (``sync_every``) and the outer Nesterov momentum.

* Stage 1: Streaming FP4 (P = 3, tau = 1, alpha 0.5) and DiLoCo M = 2 (P = 1, tau = 0, FP32), at global batch 64
  and 128, H in {10, 15, 30, 60} x outer momentum in {0.5, 0.9}, outer lr 0.7, seed 0. Streaming's H = 30,
  momentum 0.9 point is the frontier's own run (results-gpu.jsonl there) and is not run again.
* Stage 2: at each (method, batch)'s best (H, momentum), outer lr 0.5 and 1.0 (0.7 / sqrt 2 and 0.7 x sqrt 2);
  and seeds 1-4 at each method's best (batch, H, momentum) at outer lr 0.7 (none where the frontier has them).
* Stage 3: where an outer lr of stage 2 beat 0.7 at a method's best batch, seeds 1-4 there (none did).
* Stage 4, written by hand from stages 1-2 (both methods' best batch was 128, and 0.7 stayed the best outer lr):
  DiLoCo's best (H 10, momentum 0.5) sat at the low edge of both, so H 5 (seeds 0-4) and momentum 0.3 (H 5, 10);
  Streaming's best H by seed 0 (15) and its runner-up (10) are 0.09 apart, inside the seed spread, so seeds 1-4
  at H 10 and H 5 (seeds 0-2); and the inner lr re-bracketed (x2, /2) at both methods' best point.

The best is chosen on seed 0, as the frontier chose its lrs. Grid files already written are never overwritten.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from diloco.studies import STUDIES
from diloco.studies.frontier import BASE, STREAM, TOKENS
from diloco.studies.grid_files import train_grid

HERE = STUDIES / "outer-steps"
ROOT = HERE.parents[1]
FRONTIER = STUDIES / "frontier"

SIZE = "cpu-1m"
BATCHES = (64, 128)
SYNC_EVERY = (10, 15, 30, 60)
MOMENTA = (0.5, 0.9)
OUTER_LR = 0.7
OUTER_LRS_AROUND = (0.5, 1.0)
INNER_LR = 0.016  # the frontier's best at batch 64 and 128 for DP and Streaming (results-gpu.jsonl)
SEEDS = (1, 2, 3, 4)

#: name -> (trainer method, base settings beyond the frontier's BASE)
METHODS = {
    "streaming-fp4-tau1": ("streaming", {k: v for k, v in STREAM.items() if k != "outer_momentum"}),
    "diloco-m2": ("diloco", {}),
}


def _base(extra: dict, momentum: float) -> dict:
    return {
        **BASE,
        **extra,
        "outer_momentum": momentum,
        "sources": [f"{TOKENS}/train.bin", f"{TOKENS}/val.bin"],
        "device": "cuda",
        "runs_dir": f"runs/outer-steps-gpu/{SIZE}",
    }


def grid(
    name: str, *, batch: int, momentum: float, sync_every: list[int], outer_lr: list[float], seed: int = 0, why: str
) -> dict:
    method, extra = METHODS[name]
    return train_grid(
        f"Outer steps: {name} at {SIZE}, global batch {batch}, outer momentum {momentum}: {why}",
        size=SIZE, batch=batch, method=method, replicas=2, sync_every=sync_every, outer_lr=outer_lr,
        inner_lr=[INNER_LR], seed=seed, base=_base(extra, momentum),
    )  # fmt: skip


def stage1() -> dict[str, dict]:
    """Longest runs first (batch 64 has twice the steps; small H syncs most), so the last wave is short."""
    out = {}
    for batch in BATCHES:
        for name in METHODS:
            for momentum in MOMENTA:
                hs = [h for h in SYNC_EVERY if not (name.startswith("streaming") and h == 30 and momentum == 0.9)]
                out[f"b{batch}-{name}-mom{momentum}"] = grid(
                    name,
                    batch=batch,
                    momentum=momentum,
                    sync_every=hs,
                    outer_lr=[OUTER_LR],
                    why="H bracketed (stage 1).",
                )
    return out


def method_of(record: dict) -> str | None:
    """The study's name for a record's method, or None for a record of another kind."""
    b = record["base"]
    if (
        b.get("eager")
        or b.get("inner_optimizer", "adamw") != "adamw"
        or record["method"] not in ("streaming", "diloco")
    ):
        return None
    if record["method"] == "diloco" and b.get("codec", "fp32") == "fp32":
        return "diloco-m2"
    if record["method"] == "streaming" and b.get("codec") == "fp4_e3m0" and b.get("overlap_steps") == 1:
        return "streaming-fp4-tau1"
    return None


def point(record: dict) -> tuple:
    """(method, batch, H, outer momentum, outer lr): one point of the study."""
    return (
        method_of(record),
        record["global_batch"],
        record["sync_every"],
        record["base"].get("outer_momentum", 0.9),
        record["outer_lr"],
    )


def load(paths: list[Path]) -> list[dict]:
    """The finished cpu-1m records at the frontier's inner lr, on the GPU, of the study's two methods."""
    out = []
    for path in paths:
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else None
            if (
                r
                and r.get("status") == "ok"
                and r.get("eval_loss") is not None
                and r["size"] == SIZE
                and r["base"].get("device") == "cuda"
                and r["inner_lr"] == INNER_LR
                and method_of(r)
            ):
                out.append(r)
    return out


def seed0_losses(records: list[dict]) -> dict[tuple, float]:
    return {point(r): r["eval_loss"] for r in records if r.get("seed", 0) == 0}


def best(
    losses: dict[tuple, float], *, method: str, batch: int | None = None, outer_lr: float | None = OUTER_LR
) -> tuple | None:
    """The point of least seed-0 loss for ``method`` (at ``batch`` and ``outer_lr`` where given)."""
    pts = [
        p
        for p in losses
        if p[0] == method and (batch is None or p[1] == batch) and (outer_lr is None or p[4] == outer_lr)
    ]
    return min(pts, key=losses.get) if pts else None


def _has_seed(records: list[dict], p: tuple, seed: int) -> bool:
    return any(point(r) == p and r.get("seed", 0) == seed for r in records)


def stage2(records: list[dict]) -> dict[str, dict]:
    losses = seed0_losses(records)
    out = {}
    for name in METHODS:
        for batch in BATCHES:
            p = best(losses, method=name, batch=batch)
            if p:
                out[f"b{batch}-{name}-H{p[2]}-mom{p[3]}-olr"] = grid(
                    name,
                    batch=batch,
                    momentum=p[3],
                    sync_every=[p[2]],
                    outer_lr=list(OUTER_LRS_AROUND),
                    why="outer lr around 0.7 at this batch's best H and momentum (stage 2).",
                )
    for name in METHODS:
        p = best(losses, method=name)
        for seed in SEEDS if p else ():
            if not _has_seed(records, p, seed):
                out[f"b{p[1]}-{name}-H{p[2]}-mom{p[3]}-seed{seed}"] = grid(
                    name,
                    batch=p[1],
                    momentum=p[3],
                    sync_every=[p[2]],
                    outer_lr=[OUTER_LR],
                    seed=seed,
                    why=f"seed {seed} at the method's best batch, H and momentum (stage 2).",
                )
    return out


def stage3(records: list[dict]) -> dict[str, dict]:
    losses = seed0_losses(records)
    out = {}
    for name in METHODS:
        at07 = best(losses, method=name)
        overall = best(losses, method=name, outer_lr=None)
        if at07 and overall and overall[4] != OUTER_LR and overall[1:4] == at07[1:4]:
            for seed in SEEDS:
                if not _has_seed(records, overall, seed):
                    out[f"b{overall[1]}-{name}-H{overall[2]}-mom{overall[3]}-olr{overall[4]}-seed{seed}"] = grid(
                        name,
                        batch=overall[1],
                        momentum=overall[3],
                        sync_every=[overall[2]],
                        outer_lr=[overall[4]],
                        seed=seed,
                        why=f"seed {seed} at the outer lr that beat 0.7 (stage 3).",
                    )
    return out


def stage4() -> dict[str, dict]:
    """Stage 4 (module docstring): the edges and seeds that stages 1-2 asked for, at batch 128."""
    out = {}
    seeded = (  # (method, H, momentum, seeds, why)
        ("diloco-m2", 5, 0.5, range(5), "H past the edge"),
        ("streaming-fp4-tau1", 10, 0.9, SEEDS, "seeds at the runner-up H"),
        ("streaming-fp4-tau1", 5, 0.9, range(3), "H below the best two"),
    )
    for name, h, momentum, seeds, why in seeded:
        for seed in seeds:
            out[f"b128-{name}-H{h}-mom{momentum}-seed{seed}"] = grid(
                name,
                batch=128,
                momentum=momentum,
                sync_every=[h],
                outer_lr=[OUTER_LR],
                seed=seed,
                why=f"{why} (stage 4).",
            )
    out["b128-diloco-m2-mom0.3"] = grid(
        "diloco-m2",
        batch=128,
        momentum=0.3,
        sync_every=[5, 10],
        outer_lr=[OUTER_LR],
        why="momentum past the edge (stage 4).",
    )
    for name, h, momentum in (("diloco-m2", 10, 0.5), ("streaming-fp4-tau1", 15, 0.9)):
        g = grid(
            name,
            batch=128,
            momentum=momentum,
            sync_every=[h],
            outer_lr=[OUTER_LR],
            why="the inner lr re-bracketed at the best H and momentum (stage 4).",
        )
        out[f"b128-{name}-H{h}-mom{momentum}-ilr"] = {**g, "inner_lr": [INNER_LR / 2, INNER_LR * 2]}
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("1", "2", "3", "4") or (argv[0] in ("2", "3") and len(argv) < 2):
        print(__doc__, file=sys.stderr)
        return 2
    stage = argv[0]
    if stage in ("1", "4"):
        todo = stage1() if stage == "1" else stage4()
    else:
        records = load([Path(a) for a in argv[1:]] + [FRONTIER / "results-gpu.jsonl"])
        todo = (stage2 if stage == "2" else stage3)(records)
    folder = HERE / "grids"
    folder.mkdir(exist_ok=True)
    for name, g in sorted(todo.items(), key=lambda kv: kv[1]["global_batch"][0]):  # longest runs first
        path = folder / f"{name}.json"
        if not path.exists():
            path.write_text(json.dumps(g, indent=1) + "\n")
        print(path.relative_to(ROOT))
    return 0
