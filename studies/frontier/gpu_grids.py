"""The frontier's brackets on one CUDA GPU: the CPU grids' runs, unchanged but for the device and the data files.

    .venv/bin/python studies/frontier/gpu_grids.py [SIZE]          # writes studies/frontier/grids/gpu/*.json, prints them in order
    .venv/bin/python studies/frontier/gpu_grids.py [SIZE] --next   # also the second stage, from results-gpu.jsonl

Every grid is a CPU grid of write_grids.py (same model, corpus, token budget, schedule, bf16 + torch.compile, one
thread per run) with three changes: ``device`` cuda, ``sources`` the corpus's token files (token_files.py writes
them to runs/frontier-tokens: the same ids as the ``large`` corpus, checked by each record's ``data_sha256``),
and ``runs_dir`` runs/frontier-gpu/SIZE. Their records go to results-gpu.jsonl, a set of its own: a GPU run
and a CPU run of one point differ in rounding, so each method's gap is taken against DP on the same device.

The order is the order of need: at global batch 128 (DP's and Streaming's best on the CPU) every method at
three inner lrs, then every method at 64 and 256, so that a sweep stopped part-way has the most useful part.
``--next`` adds the second stage, read off the first stage's records: one more lr past every best that sits at
an edge of the lrs tried at its batch (both neighbours where one lr was tried); half (or twice) the batch where a
method's best batch sits at the lower (upper) edge of those tried, at its best lr there and half of it (twice,
going up); and more seeds (1 for every method, 2 for DP, Streaming and eager) at each method's best batch and lr:
how far rounding and seed alone move a final loss. grids/gpu/order-stage2.txt lists the second stage as it ran
(the first stage's grids, done, then the new ones); order-stage3.txt the third, written from the second's results:
seeds 3 and 4 of DP, Streaming and eager and seed 2 of the others at their best, and the lr below four bests that
still sat at the low edge (none of them at a method's best batch).
Existing grid files are never overwritten.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from write_grids import grids  # noqa: E402

TOKENS = "runs/frontier-tokens"
#: the issue's methods (and top-k at twice SparseLoCo's density, the codec nearest the 0.5-bit target)
ORDER = (
    "dp",
    "streaming-fp4-tau1",
    "eager-fp4-mom0.5",
    "stat4-ef0.9",
    "stat2-ef0.9",
    "topk-sparseloco",
    "topk-d32",
    "muon-stat4-ef0.9",
    "dp-muon",
)
ADAMW_LRS = {128: (0.004, 0.008, 0.016), 64: (0.008, 0.016), 256: (0.016, 0.032)}
MUON_LRS = {128: (0.008, 0.016, 0.032), 64: (0.016, 0.032), 256: (0.032, 0.064)}


def gpu_grids(size: str) -> dict[str, dict]:
    out = {}
    for batch in (128, 64, 256):
        template = grids(size, (batch,))
        for method in ORDER:
            grid = template[f"{size}-b{batch}-{method}"]
            lrs = (MUON_LRS if "muon" in method else ADAMW_LRS)[batch]
            if method == "dp" and batch == 128:
                lrs = (*lrs, 0.032)  # DP's best on the CPU (1.6e-2) sat at the edge
            base = {
                **grid["base"],
                "sources": [f"{TOKENS}/train.bin", f"{TOKENS}/val.bin"],
                "device": "cuda",
                "runs_dir": f"runs/frontier-gpu/{size}",
            }
            out[f"{size}-b{batch}-{method}"] = {
                **grid,
                "inner_lr": list(lrs),
                "base": base,
                "_comment": f"{grid['_comment']} On one CUDA GPU, on the corpus's token files (gpu_grids.py).",
            }
    return out


def _best(records: list[dict], size: str) -> tuple[dict, dict]:
    """(method, batch) -> {lr: loss} and method -> its best (batch, lr), from the finished records at ``size``."""
    from report import method_name

    by: dict[tuple, dict] = {}
    for r in records:
        if r.get("status") == "ok" and r.get("eval_loss") is not None and r["size"] == size and r.get("seed", 0) == 0:
            by.setdefault((method_name(r), r["global_batch"]), {})[r["inner_lr"]] = r["eval_loss"]
    best = {}
    for (method, batch), losses in by.items():
        lr = min(losses, key=losses.get)
        if method not in best or losses[lr] < by[(method, best[method][0])][best[method][1]]:
            best[method] = (batch, lr)
    return by, best


def next_stage(size: str, records: list[dict]) -> dict[str, dict]:
    """The second stage (module docstring), in order: slow runs first, so that a sweep's last wave is short."""
    first = gpu_grids(size)
    by, best = _best(records, size)
    edges, batches, seeds = {}, {}, {}
    for (method, batch), losses in sorted(by.items()):
        lrs, lr = sorted(losses), min(losses, key=losses.get)
        new = [lr / 2, 2 * lr] if len(lrs) == 1 else [2 * lr] if lr == lrs[-1] else [lr / 2] if lr == lrs[0] else []
        for x in new if f"{size}-b{batch}-{method}" in first else []:
            edges[(batch, method, x)] = first[f"{size}-b{batch}-{method}"]
    for method, (batch, lr) in best.items():
        tried = sorted(b for m, b in by if m == method)
        if len(tried) > 1 and batch in (tried[0], tried[-1]):
            b2, lrs = (batch // 2, (lr / 2, lr)) if batch == tried[0] else (batch * 2, (lr, 2 * lr))
            template = grids(size, (b2,))[f"{size}-b{b2}-{method}"]
            base = {**first[f"{size}-b{batch}-{method}"]["base"]}
            batches[(b2, method)] = {
                **template,
                "inner_lr": list(lrs),
                "base": base,
                "_comment": f"{template['_comment']} On one CUDA GPU (gpu_grids.py --next): "
                f"{method}'s best batch ({batch}) sat at an edge.",
            }
        for seed in (1, 2) if method in ("dp", "streaming-fp4-tau1", "eager-fp4-mom0.5") else (1,):
            grid = first[f"{size}-b{batch}-{method}"]
            seeds[(batch, method, seed)] = {
                **grid,
                "inner_lr": [lr],
                "seed": seed,
                "_comment": f"{grid['_comment']} Seed {seed} at its best batch and lr.",
            }
    out = {}
    for (b2, method), grid in sorted(batches.items()):
        out[f"{size}-b{b2}-{method}"] = grid
    for (batch, method, lr), grid in sorted(edges.items(), key=lambda kv: (-kv[0][0] if kv[0][0] < 128 else 0, kv[0])):
        out[f"{size}-b{batch}-{method}-lr{lr:g}"] = {
            **grid,
            "inner_lr": [lr],
            "_comment": f"{grid['_comment']} (--next: one more lr past the best at an edge)",
        }
    for (batch, method, seed), grid in sorted(seeds.items()):
        out[f"{size}-b{batch}-{method}-seed{seed}"] = grid
    return {k: v for k, v in sorted(out.items(), key=lambda kv: kv[1]["global_batch"][0])}


def main() -> int:
    args = [a for a in sys.argv[1:] if a != "--next"]
    size = args[0] if args else "cpu-1m"
    folder = HERE / "grids" / "gpu"
    folder.mkdir(parents=True, exist_ok=True)
    todo = gpu_grids(size)
    if "--next" in sys.argv[1:]:
        records = [json.loads(line) for line in (HERE / "results-gpu.jsonl").read_text().splitlines() if line.strip()]
        todo |= next_stage(size, records)
    for name, grid in todo.items():
        path = folder / f"{name}.json"
        if not path.exists():
            path.write_text(json.dumps(grid, indent=1) + "\n")
        print(path.relative_to(HERE.parents[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
