"""The frontier's brackets on one CUDA GPU: the CPU grids' runs, unchanged but for the device and the data files.

    .venv/bin/python studies/frontier/gpu_grids.py [SIZE]   # writes studies/frontier/grids/gpu/*.json, prints them in order

Every grid is a CPU grid of write_grids.py (same model, corpus, token budget, schedule, bf16 + torch.compile, one
thread per run) with three changes: ``device`` cuda, ``sources`` the corpus's token files (token_files.py writes
them to runs/frontier-tokens: the same ids as the ``large`` corpus, checked by each record's ``data_sha256``),
and ``runs_dir`` runs/frontier-gpu/SIZE. Their records go to results-gpu.jsonl, a set of its own: a GPU run
and a CPU run of one point differ in rounding, so each method's gap is taken against DP on the same device.

The order is the order of need: at global batch 128 (DP's and Streaming's best on the CPU) every method at
three inner lrs, then every method at 64 and 256, so that a sweep stopped part-way has the most useful part.
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
ORDER = ("dp", "streaming-fp4-tau1", "eager-fp4-mom0.5", "stat4-ef0.9", "stat2-ef0.9", "topk-sparseloco",
         "topk-d32", "muon-stat4-ef0.9", "dp-muon")
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
            base = {**grid["base"], "sources": [f"{TOKENS}/train.bin", f"{TOKENS}/val.bin"], "device": "cuda",
                    "runs_dir": f"runs/frontier-gpu/{size}"}
            out[f"{size}-b{batch}-{method}"] = {
                **grid, "inner_lr": list(lrs), "base": base,
                "_comment": f"{grid['_comment']} On one CUDA GPU, on the corpus's token files (gpu_grids.py)."}
    return out


def main() -> int:
    size = sys.argv[1] if len(sys.argv) > 1 else "cpu-1m"
    folder = HERE / "grids" / "gpu"
    folder.mkdir(parents=True, exist_ok=True)
    for name, grid in gpu_grids(size).items():
        path = folder / f"{name}.json"
        if not path.exists():
            path.write_text(json.dumps(grid, indent=1) + "\n")
        print(path.relative_to(HERE.parents[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
