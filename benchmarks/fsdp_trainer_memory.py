"""Memory per rank of the trainer's FSDP workers (``diloco train --set worker_sharding=fsdp``) at R = 1, 2, 4.

Runs the real command line under torchrun: M = 2 workers of R ranks (2R processes,
gloo), the demo preset's model (cpu-1m, vocab 4096) at seq_len 32, Streaming DiLoCo
P = 3, H = 6, tau = 1, fp32 on the wire, 12 steps (every fragment synced, so every
outer optimizer holds its Nesterov momentum), one checkpoint at the end. Each
rank's state is then read from that sharded checkpoint's index (DCP's
``.metadata``: every saved chunk, the rank that wrote it and its shape): the bytes
of the model parameters, the inner AdamW state, the global copy and the outer
optimizer state that rank holds. These are the tensors a rank keeps between
steps; what FSDP gathers transiently (one block's full parameters in forward and
backward) and the activations come on top.

Next to the library's figures for the global copy + outer state
(``benchmarks/fsdp_memory.py``: 16.3 / 8.1 / 4.1 MB per rank at R = 1 / 2 / 4).

    .venv/bin/python benchmarks/fsdp_trainer_memory.py        # ~1-2 minutes on 2 cores

Prints a table and writes benchmarks/results/fsdp_trainer_memory.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from diloco.bench import write_result

HERE = Path(__file__).resolve().parent
CATEGORIES = {"model": "params", "optim": "AdamW state", "global": "global copy", "outer": "outer state"}


def bytes_per_rank(worker_dir: Path) -> dict[int, dict[str, int]]:
    """From a worker's DCP index: rank -> category (model / optim / global / outer) -> tensor bytes it saved."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    meta = FileSystemReader(str(worker_dir)).read_metadata()
    out: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(CATEGORIES, 0))
    for index, info in meta.storage_data.items():
        item = meta.state_dict_metadata[index.fqn]
        if not isinstance(item, TensorStorageMetadata):
            continue
        chunk = next(c for c in item.chunks if tuple(c.offsets) == tuple(index.offset))
        rank = int(Path(info.relative_path).name.split("_")[2])  # __{rank}_{n}.distcp
        nbytes = math.prod(chunk.sizes) * item.properties.dtype.itemsize
        out[rank][index.fqn.split("/", 1)[0]] += nbytes
    return dict(out)


def run(R: int, out: Path, cache: Path | None, timeout: float) -> dict[int, dict[str, int]]:
    args = [
        "--preset",
        "demo",
        "--method",
        "streaming",
        "--no-progress",
        "--out",
        str(out),
        "--overwrite",
        *[
            a
            for kv in (
                "worker_sharding=fsdp",
                f"ranks_per_worker={R}",
                "seq_len=32",
                "steps=12",
                "sync_every=6",
                "codec=fp32",
                "checkpoint_every=0",
                "eval_every=1000",
                "eval_batches=1",
                "threads=1",
            )
            for a in ("--set", kv)
        ],
    ]
    if cache is not None:
        args += ["--cache-dir", str(cache)]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(2 * R),
        "-m",
        "diloco",
        "train",
        *args,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"R={R}: torchrun exited with {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    step = json.loads((out / "checkpoints" / "latest.json").read_text())["step"]
    return bytes_per_rank(out / "checkpoints" / f"step-{step:08d}" / "worker-0")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,2,4", help="R values (ranks per worker)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="tokenizer/token cache (default: diloco's)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "fsdp_trainer_memory.json")
    args = ap.parse_args(argv)
    library = {}
    lib_file = HERE / "results" / "fsdp_memory.json"
    if lib_file.exists():
        library = {
            r["R"]: r["max_global_bytes"] + r["max_outer_state_bytes"] for r in json.loads(lib_file.read_text())["rows"]
        }
    rows = []
    with tempfile.TemporaryDirectory(prefix="fsdp-trainer-memory-") as tmp:
        for R in (int(r) for r in args.ranks.split(",")):
            per_rank = run(R, Path(tmp) / f"R{R}", args.cache_dir, args.timeout)
            largest = max(per_rank.values(), key=lambda c: sum(c.values()))
            rows.append(
                {
                    "R": R,
                    "per_rank": {str(r): c for r, c in sorted(per_rank.items())},
                    "largest_rank": largest,
                    "library_global_plus_outer": library.get(R),
                }
            )
    print(
        "\ndiloco train, worker_sharding=fsdp: cpu-1m (vocab 4096), 2 workers x R ranks, Streaming P = 3, "
        "fp32;\nper rank (the largest of worker 0's R ranks), MB of tensors held between steps:"
    )
    print(
        f"{'R':>2} {'params':>8} {'AdamW':>8} {'global':>8} {'outer':>8} {'global+outer':>13} "
        f"{'library':>8} {'total':>8} {'x of R=1':>9}"
    )
    base = sum(rows[0]["largest_rank"].values())
    for r in rows:
        c = r["largest_rank"]
        lib = r["library_global_plus_outer"]
        total = sum(c.values())
        print(
            f"{r['R']:>2} {c['model'] / 1e6:>8.2f} {c['optim'] / 1e6:>8.2f} {c['global'] / 1e6:>8.2f} "
            f"{c['outer'] / 1e6:>8.2f} {(c['global'] + c['outer']) / 1e6:>13.2f} "
            f"{'-' if lib is None else f'{lib / 1e6:.2f}':>8} {total / 1e6:>8.2f} {total / base:>9.3f}"
        )
    print("library: global copy + outer state per rank from benchmarks/fsdp_memory.py (the algorithm alone).")
    write_result(
        "fsdp_trainer_memory",
        {
            "config": {
                "ranks": args.ranks,
                "size": "cpu-1m",
                "vocab": 4096,
                "seq_len": 32,
                "workers": 2,
                "fragments": 3,
            },
            "rows": rows,
        },
        out=args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
