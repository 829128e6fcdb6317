"""The bandwidth frontier at laptop scale: one grid per method and global batch, each bracketing the inner lr.

    .venv/bin/python studies/frontier/write_grids.py SIZE [BATCH]    # writes studies/frontier/grids/SIZE-*.json
    .venv/bin/python studies/frontier/write_grids.py SIZE BATCH --lr-of-batch 16   # one lr per method: its best at
                                                                                     # batch 16 (frontier-summary.json)
    .venv/bin/python studies/frontier/write_grids.py SIZE BATCH --bracket   # the lrs that bracket each method's best

Every method runs the same model, data (the large corpus), token budget (20 tokens per parameter) and
schedule as the long runs of studies/outer-tuning (warmup 120, bf16 + torch.compile, one thread), so the
gaps compare with those. Each grid brackets the inner lr at two values (the best of DP and of Streaming
at this size and their neighbour); a bracket whose best sits at an edge gets one more grid by hand.
Existing grid files are never overwritten.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

BASE = {
    "vocab_size": 4096,
    "seq_len": 128,
    "warmup_steps": 120,
    "eval_every": 200,
    "eval_batches": 16,
    "threads": 1,
    "sources": ["large"],
    "bf16": True,
    "compile": True,
}
STREAM = {"num_fragments": 3, "overlap_steps": 1, "merge_alpha": 0.5, "codec": "fp4_e3m0", "outer_momentum": 0.9}

#: name -> (method, outer_lr, base settings). The methods of the frontier, each at its papers' recipe.
METHODS = {
    "dp": ("dp", 0.7, {}),
    "streaming-fp4-tau1": ("streaming", 0.7, STREAM),
    # eager updates: the exchange overlaps a whole outer step (tau = H); outer momentum 0.9 and 0.5
    "eager-fp4-mom0.9": ("streaming", 0.7, {**STREAM, "overlap_steps": 30, "eager": True}),
    "eager-fp4-mom0.5": ("streaming", 0.7, {**STREAM, "overlap_steps": 30, "eager": True, "outer_momentum": 0.5}),
    # error feedback with the statistical quantizer (MuLoCo's beta 0.9)
    "stat4-ef0.9": ("streaming", 0.7, {**STREAM, "codec": "stat4", "ef_decay": 0.9}),
    "stat2-ef0.9": ("streaming", 0.7, {**STREAM, "codec": "stat2", "ef_decay": 0.9}),
    # SparseLoCo: top-k 1/64 with 2-bit values, accumulator decay 0.95, outer step without momentum, lr 1
    "topk-sparseloco": ("streaming", 1.0, {**STREAM, "codec": "topk", "ef_decay": 0.95, "outer_momentum": 0.0}),
    # top-k with the outer optimizer of the other methods (Nesterov 0.9, lr 0.7) in place of SparseLoCo's plain
    # step at lr 1: at cpu-1m top-k fell behind in the second half, as the inner lr decayed, where Nesterov's
    # momentum moves a persistent outer gradient about 7 times itself per sync. Measured at cpu-0.1m: it diverges (6.90 / 9.78):
    # the error-feedback accumulator already carries momentum, and the two compound
    "topk-nesterov": ("streaming", 0.7, {**STREAM, "codec": "topk", "ef_decay": 0.95}),
    # SparseLoCo at density 1/32 (0.44 bits): the one change that helped at cpu-0.1m (with chunk tables there)
    "topk-d32": (
        "streaming",
        1.0,
        {**STREAM, "codec": "topk", "topk_density": 1 / 32, "ef_decay": 0.95, "outer_momentum": 0.0},
    ),
    # SparseLoCo's plain outer step at twice its lr: a larger step for what top-k sends (cpu-0.1m: far worse)
    "topk-sparseloco-olr2": ("streaming", 2.0, {**STREAM, "codec": "topk", "ef_decay": 0.95, "outer_momentum": 0.0}),
    # an accumulator that forgets less: at decay 0.95 a value waiting 1 / density = 64 syncs keeps 0.95^64 = 4 %
    # (cpu-0.1m: worse, 5.55 against 5.30)
    "topk-ef0.99": ("streaming", 1.0, {**STREAM, "codec": "topk", "ef_decay": 0.99, "outer_momentum": 0.0}),
    # the same with a table of bin means per 4096-value chunk (0.25 bits): chunks of tensors of different
    # scales keep their own magnitudes, as SparseLoCo's per-tensor statistics do; and at density 1/32 (0.47 bits)
    "topk-chunk": (
        "streaming",
        1.0,
        {**STREAM, "codec": "topk", "topk_tables": "chunk", "ef_decay": 0.95, "outer_momentum": 0.0},
    ),
    "topk-chunk-d32": (
        "streaming",
        1.0,
        {
            **STREAM,
            "codec": "topk",
            "topk_tables": "chunk",
            "topk_density": 1 / 32,
            "ef_decay": 0.95,
            "outer_momentum": 0.0,
        },
    ),
    # MuLoCo: Muon inner optimizer with 4-bit error feedback
    "muon-stat4-ef0.9": ("streaming", 0.7, {**STREAM, "codec": "stat4", "ef_decay": 0.9, "inner_optimizer": "muon"}),
    # the fair reference for Muon + error feedback: data-parallel with Muon as its optimizer
    "dp-muon": ("dp", 0.7, {"inner_optimizer": "muon"}),
}

#: the inner lrs bracketed per size (DP's and Streaming's best there in the long runs, and the next step).
INNER_LRS = {"cpu-0.1m": [0.016, 0.032], "cpu-0.25m": [0.008, 0.016], "cpu-1m": [0.004, 0.008]}


def grids(size: str, batches: tuple[int, ...] = (16, 32)) -> dict[str, dict]:
    out = {}
    for batch in batches:
        for name, (method, outer_lr, extra) in METHODS.items():
            out[f"{size}-b{batch}-{name}"] = {
                "_comment": f"The bandwidth frontier: {name} at {size}, global batch {batch}, 20 tokens/param.",
                "runner": "train",
                "sizes": [size],
                "global_batch": [batch],
                "tokens_per_param": 20.0,
                "seed": 0,
                "methods": [method],
                "replicas": [2],
                "sync_every": [30],
                "outer_lr": [outer_lr],
                "inner_lr": INNER_LRS[size],
                "base": {**BASE, **extra, "runs_dir": f"runs/frontier/{size}"},
            }
    return out


def at_best_lr(size: str, batch: int, of_batch: int, rows: list[dict]) -> dict[str, dict]:
    """One grid per method that has a finished row at ``of_batch``: ``batch`` at that row's best inner lr. A first
    probe of another batch, one run per method; its name carries the lr, as the hand-written grids' do."""
    best = {r["method"]: r["inner_lr"] for r in rows if r["size"] == size and r["global_batch"] == of_batch}
    out = {}
    for name, grid in grids(size, (batch,)).items():
        method = name.removeprefix(f"{size}-b{batch}-")
        if method in best:
            out[f"{name}-lr{best[method]:g}"] = {
                **grid,
                "inner_lr": [best[method]],
                "_comment": f"{grid['_comment']} One inner lr: {method}'s best at global batch {of_batch}.",
            }
    return out


def bracketing(size: str, batch: int, rows: list[dict]) -> dict[str, dict]:
    """The grids that bracket each method's best inner lr at ``batch``: where one lr was tried, half and twice
    it; where the best sits at an edge of those tried, twice past that edge (``rows``: the report's, with
    ``lrs_tried``). One grid per lr, named with it; a method already bracketed gets none."""
    out = {}
    template = grids(size, (batch,))
    for r in rows:
        name = f"{size}-b{batch}-{r['method']}"
        if r["size"] != size or r["global_batch"] != batch or name not in template:
            continue
        lrs, best = sorted(set(r["lrs_tried"])), r["inner_lr"]
        new = (
            [best / 2, best * 2]
            if len(lrs) == 1
            else [best / 2]
            if best == lrs[0]
            else [best * 2]
            if best == lrs[-1]
            else []
        )
        for lr in new:
            out[f"{name}-lr{lr:g}"] = {
                **template[name],
                "inner_lr": [lr],
                "_comment": f"{template[name]['_comment']} Brackets the best inner lr "
                f"({best:g} of {', '.join(f'{x:g}' for x in lrs)} tried).",
            }
    return out


def main() -> int:
    args = sys.argv[1:]
    of_batch, bracket = None, False
    if len(args) == 4 and args[2] == "--lr-of-batch" and args[3].isdigit():
        of_batch, args = int(args[3]), args[:2]
    elif len(args) == 3 and args[2] == "--bracket":
        bracket, args = True, args[:2]
    if (
        len(args) not in (1, 2)
        or args[0] not in INNER_LRS
        or not all(b.isdigit() for b in args[1:])
        or ((of_batch is not None or bracket) and len(args) != 2)
    ):
        print(
            f"usage: write_grids.py SIZE [BATCH] [--lr-of-batch B | --bracket]  (SIZE: {', '.join(INNER_LRS)}; "
            f"BATCH: a global batch, default 16 and 32; --lr-of-batch: one lr per method, its best at batch B; "
            f"--bracket: the lrs past each best at an edge)",
            file=sys.stderr,
        )
        return 2
    folder = HERE / "grids"
    folder.mkdir(exist_ok=True)
    if of_batch is None and not bracket:
        todo = grids(args[0], tuple(int(b) for b in args[1:]) or (16, 32))
    else:
        rows = json.loads((HERE / "frontier-summary.json").read_text())["rows"]
        todo = bracketing(args[0], int(args[1]), rows) if bracket else at_best_lr(args[0], int(args[1]), of_batch, rows)
        if not todo:
            print(
                f"write_grids.py: nothing to write for {args[0]} at batch {of_batch or args[1]} from "
                f"frontier-summary.json (no finished rows there, or every best bracketed; run "
                f"studies/frontier/report.py first)",
                file=sys.stderr,
            )
            return 2
    for name, grid in todo.items():
        path = folder / f"{name}.json"
        if path.exists():
            print(f"kept {path} (exists)")
            continue
        path.write_text(json.dumps(grid, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
