"""The decoupled syncer's merge: time per fragment and peak memory, by size, learners M, codec and merge rule.

The row to compare a streaming / sharded syncer against. The syncer
(:class:`diloco.decoupled.syncer.Syncer`) is driven through its public API only: ``join`` each of the
M learners, then per round ``receive`` M reports prepared beforehand; the ``receive`` of the M-th
report runs the merge (decode M payloads, form each Delta_m against Theta, merge, outer step, encode
M replies). That call is what is timed (``time.perf_counter``, median of ``--repeats`` rounds; the
first round, which also allocates the syncer's per-learner copies ``_base`` for lossy codecs, is
reported separately). Reports of round r carry ``base_version`` = the syncer's version of the fragment
(``Syncer.versions``), so every round merges.

The model: one fragment made of real tensor shapes, an embedding (V = 1024 rows, merged by the mean
under RDA) and L transformer-like blocks of bias-free matrices (qkv d x 3d, out d x d, MLP d x 4d and
4d x d: 12 d^2 values a block), d and L chosen to come near each requested size.

The reports: the payloads are ``codec.encode`` of a small random outer gradient (N(0, 1e-3), what a
learner sends: base - theta). Encoding M distinct payloads costs as much as the merges at large sizes,
so two distinct payloads are made and the M learners take them in turn: the syncer does the same work
either way (a merge's cost does not depend on the values). Error feedback lives in learners (the
decoupled learner has none today) and does not change the syncer's work: ``stat2`` here is the
2-bit statistical codec on both directions, as the syncer runs it.

Memcpy: in the same process, ``dst.copy_(src)`` of two FP32 tensors of the fragment's size (the fastest of
9 before the rounds and 9 after them: on a shared machine a preempted copy is many times slower, and a floor is what a
memcpy costs; a 64 MiB buffer read and written before each so small fragments are copied from memory, not
from the last-level cache); each merge time is also given as a multiple of it. The machine this was
written on is shared (2 cores, load often 3-7), so wall times swing several-fold between runs; the
process CPU time (``time.process_time``, all threads) of the merge and of the memcpy is recorded too, and
their ratio (``x cpu``) is the steadier measure of the merge's work in memcpys.

Peak memory: each config runs in a fresh subprocess (``python benchmarks/syncer_merge.py --one ...``).
After the model, the syncer, the joins and the prepared reports exist, it resets the kernel's
high-water mark (writes ``5`` to ``/proc/self/clear_refs``, Linux >= 4.0) and reads ``VmRSS``; after
the rounds it reads ``VmHWM`` from ``/proc/self/status``. The growth ``VmHWM - VmRSS(before)`` divided
by the model's FP32 size is reported (the memory the merges and the per-learner copies add; the model
and the syncer's Theta / optimizer state at rest are not counted). Where clear_refs cannot be written
the high-water mark is that of the whole process and the column says ``hwm_reset: false``.

    PYTHONPATH=src python benchmarks/syncer_merge.py --quick      # smoke run, ~20 s
    PYTHONPATH=src python benchmarks/syncer_merge.py              # default subset, a few minutes on 2 cores
    PYTHONPATH=src python benchmarks/syncer_merge.py --sizes 1M,4M,16M,64M,256M --learners 2,4,8,16  # GPU box

Default grid: ``--sizes`` x ``--learners`` at ``--codec`` / ``--merge`` (fp4_e3m0, rda), plus every
``--codecs`` x ``--merges`` at ``--grid-size`` and ``--grid-learners`` (skipped with ``--no-grid``).
Prints a table and writes ``benchmarks/results/syncer_merge.json`` (``--out``). ``--label after`` keeps
what that file holds and writes the run under ``runs["after"]``; ``--src DIR`` measures another source tree,
e.g. the syncer before the streaming merge: ``git archive 286f9e9 src | tar -x -C /tmp/before`` and
``--src /tmp/before/src --label before``. The committed file holds the first rows (top level, measured before
any syncer change, without ``malloc_trim``) and, under ``runs``, the syncer before and after the streaming merge
measured by this version of the script in one sitting on one machine.

Memory after the streaming merge (one report decoded and folded at a time, learners at one version sharing one
copy): the growth does not depend on M. ``cpu/M`` is the merge's CPU time per learner in memcpys (CPU time);
with FP4 replies and RDA, about 7 per added learner and a fixed part of about 60 a merge on this CPU
(``docs/results/performance.md``). ``--threads 1`` gives the steadier times on a shared machine.

The syncer's device (``syncer_device``, ``--devices``): by default every config runs on the CPU and, where a GPU is
visible, again with the syncer on ``cuda`` (rows side by side, the ``device`` column); on a GPU the timed
``receive`` is synchronized before and after, the memcpy is a copy on the GPU, and the memory growth is CUDA's
peak allocated over what it held before the rounds. On a GPU machine, the merge beside the planner's CPU figures:

    PYTHONPATH=src python benchmarks/syncer_merge.py --sizes 16M,64M --learners 2,8 --no-grid --label gpu \
        --out benchmarks/results/syncer_merge_gpu.json      # a few minutes on one H100

Each config's child process times its rounds itself (two clocks at once, wall and process CPU, around a call
with untimed set-up before it) and imports only the tree it measures (``--src``: trees older than the
``diloco.bench`` harness too); the table and the JSON go through the harness (``print_table``, ``write_result``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

SIZE_SUFFIX = {"K": 10**3, "M": 10**6, "G": 10**9}
VOCAB = 1024
CODECS = ("fp32", "bf16", "fp4_e3m0", "stat2", "topk")
MERGES = ("mean", "rda")


def parse_size(text: str) -> int:
    """'16M' -> 16_000_000; a plain integer passes through."""
    t = text.strip().upper()
    try:
        return int(float(t[:-1]) * SIZE_SUFFIX[t[-1]]) if t[-1] in SIZE_SUFFIX else int(t)
    except (ValueError, IndexError):
        raise ValueError(f"size {text!r}: give a count such as 1M, 64M or 4000000") from None


def shape_for(values: int) -> tuple[int, int]:
    """(d, L): width and block count whose embedding + L blocks of 12 d^2 come near ``values``."""
    d = (
        64
        if values <= 250_000
        else 256
        if values <= 2_500_000
        else 512
        if values <= 10_000_000
        else 1024
        if values <= 100_000_000
        else 2048
    )
    return d, max(1, round((values - VOCAB * d) / (12 * d * d)))


class Stack(nn.Module):
    """An embedding and L blocks of transformer-shaped matrices (no forward: only the shapes matter)."""

    def __init__(self, *, width: int, num_blocks: int) -> None:
        super().__init__()
        d = width
        self.embed = nn.Embedding(VOCAB, d)
        self.blocks = nn.ModuleList(
            nn.ModuleDict(
                {
                    "qkv": nn.Linear(d, 3 * d, bias=False),
                    "out": nn.Linear(d, d, bias=False),
                    "up": nn.Linear(d, 4 * d, bias=False),
                    "down": nn.Linear(4 * d, d, bias=False),
                }
            )
            for _ in range(num_blocks)
        )


def build(values: int) -> tuple[nn.Module, int, int]:
    d, num_blocks = shape_for(values)
    torch.manual_seed(0)
    model = Stack(width=d, num_blocks=num_blocks)
    with torch.no_grad():  # default init is slow at 64M+: any values do
        for p in model.parameters():
            p.normal_(0.0, 0.02)
    return model, d, num_blocks


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def memcpy_seconds(numel: int, repeats: int = 9, *, device: str = "cpu") -> tuple[float, float]:
    """(wall, process CPU) seconds of ``dst.copy_(src)`` for FP32 tensors of ``numel`` on ``device``: the fastest of
    ``repeats`` each, from memory (a 64 MiB buffer is written between copies, so a fragment that fits the
    last-level cache is not timed from cache)."""
    src, dst = torch.randn(numel, device=device), torch.empty(numel, device=device)
    evict = torch.zeros(16 << 20, device=device)
    dst.copy_(src)
    wall, cpu = [], []
    for _ in range(repeats):
        evict.add_(1.0)  # read and written through the cache (a fill may use streaming stores that bypass it)
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        dst.copy_(src)
        _sync(device)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return min(wall), min(cpu)  # the contention-free estimate on a shared machine (a preempted copy is 10-30x slower)


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _malloc_trim() -> bool:
    """Give the C heap's free memory back to the OS (glibc ``malloc_trim(0)``), so the growth measured after it
    is memory the merges touch, not the reuse of what building the model and the payloads left free."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


def _reset_hwm() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def run_one(
    *, values: int, learners: int, codec: str, merge: str, repeats: int, threads: int = 0, device: str = "cpu"
) -> dict:
    """One config in this process (called in a fresh subprocess by :func:`main`); ``device``: the syncer's."""
    from diloco.decoupled.messages import Report
    from diloco.decoupled.syncer import Syncer
    from diloco.wire.registry import get_codec

    torch.set_grad_enabled(False)
    if threads > 0:
        torch.set_num_threads(threads)
    model, d, num_blocks = build(values)
    n = sum(p.numel() for p in model.parameters())
    on = {"device": device} if device != "cpu" else {}  # a --src tree from before syncer_device has none
    syncer = Syncer(model, num_learners=learners, merge=merge, codec=codec, grace_gamma=0.0, **on)
    gpu = str(getattr(syncer, "device", "cpu")).startswith("cuda")
    del model
    for m in range(learners):
        syncer.join(m)
    c = get_codec(codec)
    gen = torch.Generator().manual_seed(1)
    payloads = [c.encode(torch.randn(n, generator=gen).mul_(1e-3)) for _ in range(min(2, learners))]
    copy_s, copy_cpu = memcpy_seconds(n, device=device)
    trimmed = _malloc_trim()
    reset = _reset_hwm()
    rss_before = _status_kb("VmRSS")
    if gpu:  # the growth is the GPU's: the peak of CUDA's allocator over what it held before the rounds
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        rss_before = torch.cuda.memory_allocated() // 1024
    times, cpu_times, sync_times = [], [], []
    for r in range(repeats):
        version = syncer.versions[0]
        reports = [
            Report(
                learner=m,
                fragment=0,
                payload=payloads[m % len(payloads)],
                steps=10,
                tokens=1000.0 * (1 + m % 3),
                step_time=0.0,
                sent_after_step=10 * (r + 1),
                base_version=version,
            )
            for m in range(learners)
        ]
        for rep in reports[:-1]:
            assert syncer.receive(rep) == []
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        replies = syncer.receive(reports[-1])  # its replies are on the CPU: the merge has finished on the GPU
        _sync(device)
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
        assert len(replies) == learners and syncer.versions[0] == version + 1, "the round did not merge"
        sync_times.append(syncer.records[-1].sync_time)
        del replies, reports
    hwm = torch.cuda.max_memory_allocated() // 1024 if gpu else _status_kb("VmHWM")
    again = memcpy_seconds(n, device=device)  # again, after
    copy_s, copy_cpu = (min(a, b) for a, b in zip((copy_s, copy_cpu), again, strict=True))
    growth = (hwm - rss_before) * 1024 if hwm is not None and rss_before is not None else None
    median = statistics.median(times[1:] if len(times) > 1 else times)
    cpu_median = statistics.median(cpu_times[1:] if len(cpu_times) > 1 else cpu_times)
    return {
        "device": str(getattr(syncer, "device", "cpu")),
        "values_target": values,
        "values": n,
        "width": d,
        "blocks": num_blocks,
        "learners": learners,
        "codec": codec,
        "merge": merge,
        "repeats": repeats,
        "merge_s_median": median,
        "merge_s_first": times[0],
        "merge_s_min": min(times),
        "merge_s_all": times,
        "sync_time_s_all": sync_times,
        "memcpy_s": copy_s,
        "merge_over_memcpy": median / copy_s,
        "merge_cpu_s_median": cpu_median,
        "merge_cpu_s_all": cpu_times,
        "memcpy_cpu_s": copy_cpu,
        "merge_over_memcpy_cpu": cpu_median / copy_cpu,
        "ns_per_learner_value": median / (n * learners) * 1e9,
        "peak_growth_bytes": growth,
        "model_fp32_bytes": 4 * n,
        "peak_growth_over_model": growth / (4 * n) if growth is not None else None,
        "hwm_reset": reset or gpu,
        "malloc_trim": trimmed,
        "threads": torch.get_num_threads(),
        "memcpys_per_learner": median / copy_s / learners,
        "memcpys_per_learner_cpu": cpu_median / copy_cpu / learners,
        # passes over a round's reports beyond the first (a syncer that streams decodes again when the guard acts)
        "extra_merge_passes": int(getattr(syncer, "extra_merge_passes", 0)),
    }


def configs(args: argparse.Namespace) -> list[dict]:
    out = [
        {"values": v, "learners": m, "codec": args.codec, "merge": args.merge}
        for v in args.sizes
        for m in args.learners
    ]
    if not args.no_grid:
        for codec in args.codecs:
            for merge in args.merges:
                cfg = {"values": args.grid_size, "learners": args.grid_learners, "codec": codec, "merge": merge}
                if cfg not in out:
                    out.append(cfg)
    return [{**cfg, "device": device} for cfg in out for device in args.devices]  # devices side by side


#: The printed table: header, row key (or function), format.
COLUMNS = [
    ("values", "values", ","),
    ("d", "width", ""),
    ("L", "blocks", ""),
    ("M", "learners", ""),
    ("codec", "codec", ""),
    ("merge", "merge", ""),
    ("device", "device", ""),
    ("merge s", "merge_s_median", ".3f"),
    ("first s", "merge_s_first", ".3f"),
    ("cpu s", "merge_cpu_s_median", ".3f"),
    ("memcpy ms", lambda r: 1e3 * r["memcpy_s"], ".2f"),
    ("x memcpy", "merge_over_memcpy", ".0f"),
    ("x cpu", "merge_over_memcpy_cpu", ".0f"),
    ("cpu/M", "memcpys_per_learner_cpu", ".1f"),
    ("ns/(M*val)", "ns_per_learner_value", ".1f"),
    ("peak/model", "peak_growth_over_model", ".1f"),
]


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1M,4M,16M", help="fragment sizes, e.g. 1M,4M,16M,64M,256M")
    ap.add_argument("--learners", default="2,8,16", help="M values for the size sweep (2,4,8,16 for all)")
    ap.add_argument("--codec", default="fp4_e3m0", help="codec of the size sweep")
    ap.add_argument("--merge", default="rda", help="merge rule of the size sweep")
    ap.add_argument("--codecs", default=",".join(CODECS), help="codecs of the codec x merge grid")
    ap.add_argument("--merges", default=",".join(MERGES), help="merge rules of the codec x merge grid")
    ap.add_argument("--grid-size", default="4M", help="fragment size of the codec x merge grid")
    ap.add_argument("--grid-learners", type=int, default=8, help="M of the codec x merge grid")
    ap.add_argument("--no-grid", action="store_true", help="only the size sweep")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per config (median of all but the first)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1M and 2M, M in {2, 4}, two codecs, 2 rounds")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per config before it is skipped")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default benchmarks/results/syncer_merge.json, syncer_merge_quick.json with --quick)",
    )
    ap.add_argument(
        "--label",
        default=None,
        help="keep what --out holds and write this run under runs[LABEL] in it (e.g. 'after' beside the rows before)",
    )
    ap.add_argument(
        "--src",
        type=Path,
        default=None,
        help="the diloco source tree the configs import (PYTHONPATH), e.g. an earlier commit's src from git archive",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per config (default: torch's; 1 is steadier on a shared box, where a parallel region "
        "waits for a preempted thread)",
    )
    ap.add_argument(
        "--devices",
        default="auto",
        help="the syncer's devices (syncer_device), each config on each: auto = cpu, and cuda where a GPU is visible",
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one JSON config, print its row
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(**json.loads(args.one))))
        return
    if args.quick:
        args.sizes, args.learners, args.codecs, args.merges = "1M", "2,4,16", "fp32,fp4_e3m0", "mean,rda"
        args.grid_size, args.grid_learners, args.repeats = "1M", 2, 2
    if args.out is None:
        args.out = (
            Path(__file__).parent / "results" / ("syncer_merge_quick.json" if args.quick else "syncer_merge.json")
        )
    from diloco.bench import print_table, write_result  # here: a --one child may import an older --src tree
    from diloco.decoupled.merge import check_merge
    from diloco.wire.registry import ALL_CODEC_NAMES

    args.sizes = [parse_size(s) for s in _csv(args.sizes)]
    args.grid_size = parse_size(args.grid_size)
    args.learners = [int(m) for m in _csv(args.learners)]
    args.codecs, args.merges = _csv(args.codecs), _csv(args.merges)
    auto = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    args.devices = auto if args.devices == "auto" else _csv(args.devices)
    for name in [args.codec, *args.codecs]:
        if name not in ALL_CODEC_NAMES:
            raise ValueError(f"codec {name!r}: choose from {', '.join(ALL_CODEC_NAMES)}")
    for name in [args.merge, *args.merges]:
        check_merge(name)
    if args.repeats < 1 or any(m < 1 for m in [*args.learners, args.grid_learners]):
        raise ValueError("--repeats and every M must be at least 1")

    env = None
    if args.src is not None:
        if not (args.src / "diloco" / "decoupled" / "syncer.py").is_file():
            raise ValueError(f"--src {args.src}: give a directory holding diloco/ (a checkout's src)")
        env = {**os.environ, "PYTHONPATH": str(args.src.resolve())}
    rows, skipped = [], []
    for cfg in configs(args):
        one = json.dumps({**cfg, "repeats": args.repeats, "threads": args.threads})
        try:
            proc = subprocess.run(
                [sys.executable, __file__, "--one", one],
                capture_output=True,
                text=True,
                timeout=args.timeout,
                check=False,
                env=env,
            )
        except subprocess.TimeoutExpired:
            skipped.append({**cfg, "why": f"over {args.timeout:g} s"})
            print(f"  skipped {cfg}: over {args.timeout:g} s")
            continue
        if proc.returncode != 0:
            skipped.append({**cfg, "why": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"})
            print(f"  skipped {cfg}: {skipped[-1]['why']}")
            continue
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"  {cfg}: merge {rows[-1]['merge_s_median']:.3f} s", flush=True)
    print_table(rows, COLUMNS)
    meta = {
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "quick": args.quick,
        "machine": platform.processor() or platform.machine(),
        "repeats": args.repeats,
        "python": platform.python_version(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timing": "median of rounds 2..repeats of Syncer.receive of the round's last report (the merge; on a GPU "
        "synchronized before and after)",
        "memory": "VmHWM - VmRSS before the rounds (malloc_trim(0), then HWM reset via /proc/self/clear_refs), "
        "over 4 * values; on a GPU, CUDA's peak allocated - allocated before the rounds",
        "src": str(args.src) if args.src is not None else "this checkout",
        # torch's transparent huge pages for large CPU tensors: fresh tensors' page faults cost several times less
        "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "native_codecs": os.environ.get("DILOCO_NATIVE_CODECS", "1") != "0",
    }
    doc = {"meta": meta, "rows": rows, "skipped": skipped}
    if args.label is not None:
        kept = json.loads(args.out.read_text()) if args.out.exists() else {}
        kept.setdefault("runs", {})[args.label] = doc
        doc = kept
    write_result("syncer_merge", doc, out=args.out)
    if not math.isfinite(sum(r["merge_s_median"] for r in rows)):
        raise SystemExit("a merge time is not finite")


if __name__ == "__main__":
    main()
