"""The frontier study's grids (studies/frontier): the methods and their settings, the CPU grids that bracket each
method's inner lr (``write_grids.py``), the same runs on one CUDA GPU (``gpu_grids.py``) and the method a record
belongs to. The study's scripts, the outer-steps study and the tests import them from here.

Every method runs the same model, data (the large corpus), token budget (20 tokens per parameter) and schedule as
the long runs of studies/outer-tuning (warmup 120, bf16 + torch.compile, one thread), so the gaps compare with
those. Each CPU grid brackets the inner lr at two values (the best of DP and of Streaming at this size and their
neighbour); a bracket whose best sits at an edge gets one more grid (``bracketing``, or by hand).

The GPU grids are CPU grids with three changes: ``device`` cuda, ``sources`` the corpus's token files
(token_files.py writes them to runs/frontier-tokens: the same ids as the ``large`` corpus, checked by each record's
``data_sha256``), and ``runs_dir`` runs/frontier-gpu/SIZE. Their order is the order of need: at global batch 128
every method at three inner lrs, then every method at 64 and 256. ``next_stage`` adds the second stage, read off
the first stage's records: one more lr past every best that sits at an edge of the lrs tried at its batch (both
neighbours where one lr was tried); half (or twice) the batch where a method's best batch sits at the lower (upper)
edge of those tried, at its best lr there and half of it (twice, going up); and more seeds (1 for every method,
2 for DP, Streaming and eager) at each method's best batch and lr.
"""

from __future__ import annotations

from diloco.studies import STUDIES
from diloco.studies.grid_files import train_grid

HERE = STUDIES / "frontier"
GRIDS = HERE / "grids.jsonl"  # every grid a sweep of the study ran (CPU: NAME, GPU: gpu/NAME)

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
            out[f"{size}-b{batch}-{name}"] = train_grid(
                f"The bandwidth frontier: {name} at {size}, global batch {batch}, 20 tokens/param.",
                size=size, batch=batch, method=method, replicas=2, sync_every=[30], outer_lr=[outer_lr],
                inner_lr=INNER_LRS[size], seed=0, base={**BASE, **extra, "runs_dir": f"runs/frontier/{size}"},
            )  # fmt: skip
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


def method_name(rec: dict) -> str:
    """The METHODS key a result belongs to (by its settings)."""
    base = rec["base"]
    keys = {k for _, _, extra in METHODS.values() for k in extra}  # every setting that tells methods apart
    for name, (method, outer_lr, extra) in METHODS.items():
        if method != rec["method"]:
            continue
        if all(base.get(k) == extra.get(k) for k in keys) and (method == "dp" or outer_lr == rec["outer_lr"]):
            return name  # DP: told apart by its inner optimizer alone (its outer lr is unused)
    return "?"


TOKENS = "runs/frontier-tokens"
#: the study's methods (and top-k at twice SparseLoCo's density, the codec nearest the 0.5-bit target)
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


def best_per_method(records: list[dict], size: str) -> tuple[dict, dict]:
    """(method, batch) -> {lr: loss} and method -> its best (batch, lr), from the finished records at ``size``."""
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
    by, best = best_per_method(records, size)
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
