"""Codec speed against a memcpy: the torch reference, the chunked torch path and the fused C loops.

For each codec, on N(0, 1) FP32 values, the throughput in GB/s of FP32 values (``4 * numel`` bytes over the
time) of three paths: ``reference`` (``encode_reference`` / ``decode_reference``, the whole tensor at once),
``chunked`` (the torch code a chunk of ``diloco.wire.codec.CHUNK`` values at a time, what the codecs ran on
CPU before the C loops; the reference for codecs without one) and ``default`` (``encode`` / ``decode``: the
C loops of :mod:`diloco.wire.native` where a codec has them, else as ``chunked``), each also as a share of a
memcpy's bandwidth (``dst.copy_(src)`` into a kept buffer, ``4 * numel`` bytes over its time) timed in the
same rounds (``diloco.bench.time_rounds``: memcpy, encode, decode, ... in turn). ``decode_into`` (into a kept
buffer) is timed for the default path: ``decode`` returns a fresh tensor, whose page faults alone cost several
memcpys on Linux (the ``alloc`` row: ``torch.empty(numel).fill_(0)``), so the default path's decode is also given
as a share of a copy into a fresh tensor (``x.clone()``, ``dec % clone``), timed in the same rounds. Shares are given from wall time (the
median of ``--repeats``) and from process CPU time (all threads; steadier where other jobs share the cores).
Targets: >= 25 % of a memcpy for FP4, int8 and bf16, >= 10 % for the statistical codecs.

Before timing, each path's payload and decode are checked against the reference's (the same bytes; the same
fp32 bits, NaN for NaN); the script exits non-zero if one differs.

    PYTHONPATH=src python benchmarks/codec_speed.py            # 16M values, ~3 minutes on 2 cores
    PYTHONPATH=src python benchmarks/codec_speed.py --quick    # 1M values: checks the script runs
    PYTHONPATH=src python benchmarks/codec_speed.py --march x86-64-v3 --codecs fp4_e2m1,fp4_e3m0,int8,bf16
                                                               # the loops an AVX2 CPU runs, on this one

``THP_MEM_ALLOC_ENABLE=1`` (a torch setting: transparent huge pages for large CPU tensors) makes fresh
tensors several times cheaper here; the JSON records whether it was set. Prints a table and writes
``benchmarks/results/codec_speed.json`` (``codec_speed_quick.json`` with --quick).
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from diloco.bench import add_out, add_quick, machine, print_table, time_rounds, write_result
from diloco.wire import native
from diloco.wire.codec import CHUNK
from diloco.wire.registry import get_codec

CODECS = ("fp4_e3m0", "fp4_e2m1", "int8", "fp8_e4m3", "bf16", "stat4", "stat2")
TARGET = {"fp4_e3m0": 0.25, "fp4_e2m1": 0.25, "int8": 0.25, "bf16": 0.25, "stat4": 0.10, "stat2": 0.10}
NATIVE = ("fp4_e3m0", "fp4_e2m1", "int8", "bf16")


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns, any NaN equal to any NaN (torch's own NaN payloads depend on its thread split)."""
    if a.dtype == torch.uint8:
        return torch.equal(a, b)
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def paths(codec, x: torch.Tensor, payload: torch.Tensor, out: torch.Tensor) -> dict[str, dict]:
    n = x.numel()
    fns = {
        "reference": {
            "encode": lambda: codec.encode_reference(x),
            "decode": lambda: codec.decode_reference(payload, n),
        },
        "chunked": {
            "encode": lambda: codec.encode(x, chunk=CHUNK),
            "decode": lambda: codec.decode(payload, n, chunk=CHUNK),
        },
        "default": {
            "encode": lambda: codec.encode(x),
            "decode": lambda: codec.decode(payload, n),
            "decode_into": lambda: codec.decode_into(payload, n, out),
        },
    }
    return fns


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numel", type=int, default=1 << 24)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument(
        "--march",
        default="native",
        help="build the C loops of blocks.c for another -march (x86-64-v3: AVX2, x86-64: SSE2) and time those; "
        "the statistical codecs keep this CPU's build",
    )
    add_quick(ap, "1M values, 3 repeats")
    add_out(ap, "codec_speed")
    args = ap.parse_args()
    name_out = "codec_speed"
    if args.quick:
        args.numel, args.repeats, name_out = 1 << 20, 3, "codec_speed_quick"
        if args.out.name == "codec_speed.json":
            args.out = args.out.with_name("codec_speed_quick.json")
    if args.march != "native":
        import subprocess
        import tempfile
        from pathlib import Path

        from diloco.wire.native import blocks

        try:
            lib = native.build_for(args.march, Path(tempfile.mkdtemp()) / f"blocks-{args.march}.so")
        except (subprocess.CalledProcessError, OSError) as e:
            detail = (getattr(e, "stderr", b"") or b"").decode(errors="replace").strip().splitlines()[-1:]
            raise SystemExit(
                f"--march {args.march}: the C compiler could not build for it ({' '.join(detail) or e}); give an "
                f"-march this compiler knows and this CPU runs, e.g. x86-64-v3 (AVX2) or x86-64 (SSE2)"
            ) from None
        blocks.library = lambda: lib  # what encode / decode of the block-scaled codecs and bf16 call
        name_out += f"_{args.march.replace('-', '_')}"
        if args.out.name == "codec_speed.json":
            args.out = args.out.with_name(f"{name_out}.json")
    n = args.numel
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    gb = 4 * n / 1e9
    dst, out = torch.empty_like(x), torch.empty_like(x)
    names = [c.strip() for c in args.codecs.split(",") if c.strip()]
    rows, identical = [], True
    base = time_rounds(
        {"memcpy": lambda: dst.copy_(x), "alloc": lambda: torch.empty(n).fill_(0.0)}, repeats=2 * args.repeats, warmup=1
    )
    print(
        f"{n:,} fp32 values; memcpy {gb / base['memcpy'].median:.2f} GB/s; a fresh tensor "
        f"{base['alloc'].median / base['memcpy'].median:.1f} memcpys; threads {torch.get_num_threads()}; "
        f"C loops {'on' if native.usable(x) else 'off'}"
    )
    for name in names:
        codec = get_codec(name)
        payload = codec.encode_reference(x)
        want = codec.decode_reference(payload, n)
        for path, fns in paths(codec, x, payload, out).items():
            if path == "reference":
                ok = True
            else:
                ok = same_bits(fns["encode"](), payload) and same_bits(fns["decode"](), want)
                if "decode_into" in fns:
                    ok = ok and same_bits(fns["decode_into"](), want)
            identical &= ok
            timed = {"memcpy": lambda: dst.copy_(x), **fns}
            if path == "default":
                timed["clone"] = x.clone
            wall = time_rounds(timed, repeats=args.repeats, warmup=1)
            cpu = time_rounds(timed, repeats=args.repeats, warmup=0, clock=time.process_time)
            row = {
                "codec": name,
                "path": path,
                "fused": path == "default" and name in NATIVE and native.usable(x),
                "bit_identical_to_reference": ok,
                "target_share": TARGET.get(name),
                "memcpy": wall["memcpy"].as_dict(),
            }
            if path == "default":
                row["clone"] = wall["clone"].as_dict()
                row["decode_share_of_clone"] = wall["clone"].median / wall["decode"].median
            for op in fns:
                row[op] = {"wall": wall[op].as_dict(), "cpu": cpu[op].as_dict()}
                row[f"{op}_gb_s"] = gb / wall[op].median
                row[f"{op}_share"] = wall["memcpy"].median / wall[op].median
                row[f"{op}_share_cpu"] = cpu["memcpy"].median / cpu[op].median
            rows.append(row)
            print(f"  {name} {path}: done", flush=True)

    def pct(key: str):
        return lambda r: None if r.get(key) is None else 100 * r[key]

    print_table(
        rows,
        [
            ("codec", "codec", ""),
            ("path", "path", ""),
            ("enc GB/s", "encode_gb_s", ".2f"),
            ("enc %", pct("encode_share"), ".1f"),
            ("enc % cpu", pct("encode_share_cpu"), ".1f"),
            ("dec GB/s", "decode_gb_s", ".2f"),
            ("dec %", pct("decode_share"), ".1f"),
            ("dec % cpu", pct("decode_share_cpu"), ".1f"),
            ("dec % clone", pct("decode_share_of_clone"), ".0f"),
            ("into %", pct("decode_into_share"), ".1f"),
            ("into % cpu", pct("decode_into_share_cpu"), ".1f"),
            ("target %", pct("target_share"), ".0f"),
            ("same bits", "bit_identical_to_reference", ""),
        ],
        title="\n% = share of a memcpy's bandwidth, same rounds (wall: medians; cpu: process CPU time)",
    )
    meta = {
        "numel": n,
        "repeats": args.repeats,
        "chunk": CHUNK,
        "memcpy": base["memcpy"].as_dict(),
        "alloc": base["alloc"].as_dict(),
        "memcpy_gb_s": gb / base["memcpy"].median,
        "alloc_in_memcpys": base["alloc"].median / base["memcpy"].median,
        "native": native.usable(x),
        "march": args.march,
        "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "quick": args.quick,
        "machine": machine(),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timing": "time_rounds: memcpy and the path's calls in turn; share = memcpy median / codec median, same rounds",
    }
    write_result(name_out, {"meta": meta, "rows": rows}, out=args.out)
    if not identical:
        raise SystemExit("a path differs from its reference")


if __name__ == "__main__":
    main()
