"""One command on a GPU machine: the GPU test suite, then the GPU measurements, as one JSON file.

    python benchmarks/gpu_check.py              # one CUDA GPU; sized for < 9 minutes; results/gpu_check.json
    python benchmarks/gpu_check.py --dry-run    # the same code on the CPU at toy sizes (~30 s): checks the script

1. ``pytest tests/gpu`` in a subprocess: counts of passed / failed / skipped and the failures' names.
2. Tokens/s of a ~110M-parameter Hugging Face Llama in bf16 under ``StreamingDiLoCo`` (H = 30, P = 4,
   tau = 1, FP4 outer gradients) against a bare loop of the same model (``benchmarks/hf_throughput.py``,
   rounds alternating between the two); goal >= 0.95x.
3. Codec encode and decode throughput on the GPU, in GB/s of FP32 values in (encode) or out (decode) and as a
   share of a device memcpy timed in the same call; for the codecs with fused code on the device (the FP4
   codecs' Triton kernels on CUDA, the C loops on CPU) the torch reference beside it.
4. Memory against the analytic figure. A bare loop (DP's state on one replica) holds the parameters and
   AdamW's two moments: 3 units of the parameters' bytes. DiLoCo adds the global copy and the outer
   Nesterov momentum: 5 units, 5/3 of DP. Measured three ways for DP, Streaming and Streaming with
   ``offload_device="cpu"``: the bytes of the state tensors on the GPU (should be 5/3 and 1), CUDA's
   allocated memory once the gradients are freed, and CUDA's peak (activations and gradients
   included: Streaming's peak is reported against DP's peak plus the 2 extra units).

Without CUDA (and without ``--dry-run``) it says so and exits 0 having measured and written nothing.
Prints a summary and writes ``benchmarks/results/gpu_check.json`` (``gpu_check-dry-run.json``).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from diloco.bench import hf_throughput, write_result
from diloco.bench.gpu_syncer import ROOT, checkout_env, run_syncer, syncer_line
from diloco.bench.hf_throughput import sync

ANALYTIC_STATE_RATIO = 5 / 3

#: What each phase runs at, on the GPU and in the dry run.
SIZES = {
    "gpu": {
        "preset": "100m",
        "vocab": 32768,
        "seq": 1024,
        "batch": 16,
        "H": 30,
        "P": 4,
        "tau": 1,
        "rounds": 4,
        "memory_batch": 8,
        "codec_values": 1 << 26,
        "codec_repeats": 10,
    },
    "dry-run": {
        "preset": "tiny",
        "vocab": 512,
        "seq": 32,
        "batch": 2,
        "H": 4,
        "P": 2,
        "tau": 1,
        "rounds": 1,
        "memory_batch": 2,
        "codec_values": 1 << 16,
        "codec_repeats": 2,
    },
}


# -- 1. the suite --------------------------------------------------------------------------------------------------------
def run_suite(timeout_s: float) -> dict[str, Any]:
    """``pytest tests/gpu`` in a subprocess (this checkout's code first on the path); its JUnit counts."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "tests/gpu",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
        ]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=checkout_env(), capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            return {
                "ok": False,
                "error": f"pytest tests/gpu still running after {timeout_s:.0f} s; stopped",
                "output_tail": str(exc.stdout or "")[-3000:],
            }
        seconds = time.perf_counter() - t0
        if not report.is_file():
            return {
                "ok": False,
                "error": f"pytest exited with {proc.returncode} and no report",
                "output_tail": (proc.stdout + proc.stderr)[-3000:],
                "seconds": seconds,
            }
        suite = ET.parse(report).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
        failed = [
            f"{case.get('classname')}::{case.get('name')}"
            for case in suite.iter("testcase")
            if case.find("failure") is not None or case.find("error") is not None
        ]
        skipped = sorted(
            {
                (case.find("skipped").get("message") or "")
                for case in suite.iter("testcase")
                if case.find("skipped") is not None
            }
        )
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {
        "ok": proc.returncode == 0,
        "returncode": proc.returncode,
        "passed": passed,
        **counts,
        "failed": failed,
        "skip_reasons": skipped,
        "seconds": seconds,
        "output_tail": (proc.stdout + proc.stderr)[-3000:] if proc.returncode else "",
    }


# -- 2. throughput -------------------------------------------------------------------------------------------------------
def run_throughput(device: torch.device, size: dict[str, Any]) -> dict[str, Any]:
    args = SimpleNamespace(
        preset=size["preset"],
        device=str(device),
        bf16=True,
        vocab=size["vocab"],
        seq=size["seq"],
        batch=size["batch"],
        H=size["H"],
        P=size["P"],
        tau=size["tau"],
        codec="fp4_e3m0",
        rounds=size["rounds"],
    )
    out = hf_throughput.run(args)
    out["goal"] = 0.95
    out["meets_goal"] = out["ratio_median"] >= 0.95
    return out


# -- 3. codec encode / decode -------------------------------------------------------------------------------------------
#: The codecs timed: those with a speed target (a share of a memcpy's bandwidth). On CPU they run the C loops
#: of diloco.wire.native; on CUDA the FP4 codecs run Triton kernels (diloco.wire.triton_codecs), the others the
#: torch code (``fused_path`` in the result says which: "c", "triton" or None).
CODECS_TIMED = ("fp4_e3m0", "fp4_e2m1", "int8", "bf16", "stat4", "stat2")


#: (blocks per program, warps, register cap) the first FP4 codec's Triton kernels are also timed at: speed only, the
#: same bytes. The encode puts a block in a thread: 32 x warps blocks is one each, twice that two each; it takes about
#: 160 registers (3 programs of 4 warps an SM), and 128 (4 programs, a few spills) where capped.
TRITON_CONFIGS = ((64, 2, None), (128, 4, None), (256, 8, None), (256, 4, None), (128, 4, 128), (256, 8, 128))


def _triton_configs(codec, x: torch.Tensor, payload: torch.Tensor, repeats: int, memcpy_s: float) -> list[dict]:
    """The Triton encode and decode at each of :data:`TRITON_CONFIGS`: shares of the memcpy, and whether the
    payload and the decoded values are the default launch's (an option this triton lacks: its error)."""
    from diloco.wire import triton_codecs

    mod, fmt, n = triton_codecs.kernels(), triton_codecs.element_format(codec), x.numel()
    want, out, p = codec.decode(payload, n), torch.empty_like(x), torch.empty_like(payload)
    kw = {"fmt": fmt, "elem_max": codec.element_max, "top": codec._top, "j0": codec._j0}
    rows = []
    for r, w, cap in TRITON_CONFIGS:
        row = {"rows": r, "warps": w, "maxnreg": cap}
        try:
            enc_s = _timed(
                x.device, lambda r=r, w=w, cap=cap: mod.encode(x, p, **kw, rows=r, warps=w, maxnreg=cap), repeats
            )
        except Exception as exc:
            rows.append(row | {"error": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        dec_s = _timed(x.device, lambda r=r, w=w: mod.decode(payload, n, out, fmt=fmt, rows=r, warps=w), repeats)
        row |= {"encode_share_of_memcpy": memcpy_s / enc_s, "decode_share_of_memcpy": memcpy_s / dec_s}
        rows.append(row | {"same_bits": torch.equal(p, payload) and _same_bits(out, want)})
    return rows


def _timed(device: torch.device, fn, repeats: int) -> float:
    fn()  # warm-up (kernels, allocator)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeats


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.uint8:
        return torch.equal(a, b)
    return bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def run_codec(device: torch.device, size: dict[str, Any], names: tuple[str, ...] = CODECS_TIMED) -> dict[str, Any]:
    """Encode and decode GB/s (FP32 bytes per second) of each codec on ``device`` and their share of a device
    memcpy's (``dst.copy_(x)``) timed in the same call; ``same_as_cpu``: the device's payload and decode of the
    first 64K values are the CPU's bit for bit. The top-level keys are the first codec's (fp4_e3m0)."""
    from diloco.wire import native, triton_codecs
    from diloco.wire.registry import get_codec

    n, repeats = size["codec_values"], size["codec_repeats"]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g).to(device)
    dst = torch.empty_like(x)
    fp32_bytes = 4 * n
    memcpy_s = _timed(device, lambda: dst.copy_(x), repeats)
    rows = []
    for name in names:
        codec = get_codec(name)
        payload = codec.encode(x)
        enc_s = _timed(device, lambda codec=codec: codec.encode(x), repeats)
        dec_s = _timed(device, lambda codec=codec, payload=payload: codec.decode(payload, n), repeats)
        head = x[: min(n, 1 << 16)]
        small = codec.encode(head)
        same = _same_bits(small.cpu(), codec.encode(head.cpu())) and _same_bits(
            codec.decode(small, head.numel()).cpu(), codec.decode(small.cpu(), head.numel())
        )
        fused_path = None
        if device.type == "cpu" and native.usable(x):
            fused_path = "c"
        elif triton_codecs.usable(codec, x):
            fused_path = "triton"
        row = {
            "codec": name,
            "values": n,
            "fp32_bytes": fp32_bytes,
            "payload_bytes": payload.numel(),
            "fused": fused_path is not None,
            "fused_path": fused_path,
            "encode_s": enc_s,
            "decode_s": dec_s,
            "encode_GBps": fp32_bytes / enc_s / 1e9,
            "decode_GBps": fp32_bytes / dec_s / 1e9,
            "encode_share_of_memcpy": memcpy_s / enc_s,
            "decode_share_of_memcpy": memcpy_s / dec_s,
            "same_as_cpu": same,
        }
        if fused_path is not None:  # the torch reference on the same device, in the same call
            ref_enc_s = _timed(device, lambda codec=codec: codec.encode_reference(x), repeats)
            ref_dec_s = _timed(device, lambda codec=codec, payload=payload: codec.decode_reference(payload, n), repeats)
            row |= {
                "reference_encode_GBps": fp32_bytes / ref_enc_s / 1e9,
                "reference_decode_GBps": fp32_bytes / ref_dec_s / 1e9,
                "reference_encode_share_of_memcpy": memcpy_s / ref_enc_s,
                "reference_decode_share_of_memcpy": memcpy_s / ref_dec_s,
                "same_as_reference": _same_bits(payload, codec.encode_reference(x))
                and _same_bits(codec.decode(payload, n), codec.decode_reference(payload, n)),
            }
        if fused_path == "triton" and not any("triton_configs" in r for r in rows):
            row["triton_configs"] = _triton_configs(codec, x, payload, repeats, memcpy_s)
        rows.append(row)
    return {**rows[0], "memcpy_s": memcpy_s, "memcpy_GBps": fp32_bytes / memcpy_s / 1e9, "codecs": rows}


# -- 4. memory -----------------------------------------------------------------------------------------------------------
def _bytes_on(tensors, device: torch.device) -> int:
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type == device.type and t.dim() > 0:
            storage = t.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


def _memory_variant(variant: str, device: torch.device, size: dict[str, Any]) -> dict[str, Any]:
    from diloco import StreamingDiLoCo, run_replicas
    from diloco.models.hf import build_hf_model

    fields = hf_throughput.PRESETS[size["preset"]]
    vocab, seq, batch, H = size["vocab"], size["seq"], size["memory_batch"], size["H"]

    def replica(comm):
        torch.manual_seed(0)
        model = build_hf_model(fields, vocab_size=vocab, seq_len=seq).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
        algo = None
        if variant != "dp":
            algo = StreamingDiLoCo(
                model,
                comm=comm,
                sync_every=H,
                num_fragments=size["P"],
                overlap_steps=size["tau"],
                merge_alpha=0.5,
                codec="fp4_e3m0",
                offload_device="cpu" if variant == "streaming_offload" else None,
            )
        g = torch.Generator().manual_seed(0)
        data = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(H + size["tau"] + 1):  # every fragment synced once: the outer momentum exists
            with torch.autocast(device.type, dtype=torch.bfloat16):
                _, loss = model(data[:, :-1], data[:, 1:])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if algo is not None:
                algo.step()
        sync(device)
        params = list(model.parameters())
        opt_state = [v for st in opt.state.values() for v in st.values()]
        algo_state = (
            []
            if algo is None
            else list(algo.global_flat)
            + [v for o in algo.outer_optimizers for st in o.state.values() for v in st.values()]
        )
        out = {
            "variant": variant,
            "param_bytes": _bytes_on(params, device),
            "state_bytes_on_device": _bytes_on(params + opt_state + algo_state, device),
            "algorithm_bytes_on_device": _bytes_on(algo_state, device),
            "algorithm_bytes_offloaded": _bytes_on(algo_state, torch.device("cpu")) if device.type != "cpu" else None,
        }
        if device.type == "cuda":
            out["allocated_bytes"] = torch.cuda.memory_allocated(device)
            out["peak_bytes"] = torch.cuda.max_memory_allocated(device)
        del model, opt, algo
        return out

    return run_replicas(replica, 1)[0]


def run_memory(device: torch.device, size: dict[str, Any]) -> dict[str, Any]:
    rows = {v: _memory_variant(v, device, size) for v in ("dp", "streaming", "streaming_offload")}
    if device.type == "cuda":
        torch.cuda.empty_cache()
    dp, st, off = rows["dp"], rows["streaming"], rows["streaming_offload"]
    out: dict[str, Any] = {
        "rows": rows,
        "analytic_state_ratio": ANALYTIC_STATE_RATIO,
        "state_ratio": st["state_bytes_on_device"] / dp["state_bytes_on_device"],
        "state_ratio_offload": off["state_bytes_on_device"] / dp["state_bytes_on_device"],
    }
    if device.type == "cuda":
        extra = 2 * dp["param_bytes"]  # global copy + outer momentum, FP32 like the parameters
        out |= {
            "allocated_ratio": st["allocated_bytes"] / dp["allocated_bytes"],
            "peak_ratio": st["peak_bytes"] / dp["peak_bytes"],
            "peak_ratio_offload": off["peak_bytes"] / dp["peak_bytes"],
            "peak_predicted_bytes": dp["peak_bytes"] + extra,
            "peak_vs_predicted": st["peak_bytes"] / (dp["peak_bytes"] + extra),
        }
    return out


# -- the command ---------------------------------------------------------------------------------------------------------
def summary_lines(result: dict[str, Any]) -> list[str]:
    lines = [
        f"gpu_check on {result['device_name']} ({result['device']}), torch {result['torch']}, {result['seconds']:.0f} s"
    ]
    suite = result.get("suite")
    if suite:
        if "passed" in suite:
            lines.append(
                f"suite: {suite['passed']} passed, {suite['failures'] + suite['errors']} failed, "
                f"{suite['skipped']} skipped ({suite['seconds']:.0f} s)"
                + (f"; FAILED: {', '.join(suite['failed'])}" if suite["failed"] else "")
            )
        else:
            lines.append(f"suite: {suite['error']}")
    tp = result.get("throughput")
    if tp:
        lines.append(
            f"throughput: {tp['params'] / 1e6:.0f}M HF Llama, bf16, batch {tp['batch']} x {tp['seq']}: bare "
            f"{tp['results']['bare']['median_tok_s']:,.0f} tok/s, streaming "
            f"{tp['results']['streaming']['median_tok_s']:,.0f} tok/s: {tp['ratio_median']:.3f}x "
            f"(goal >= 0.95: {'met' if tp['meets_goal'] else 'MISSED'})"
        )
    cd = result.get("codec")
    if cd:
        lines.append(
            f"codecs on {cd['values']:,} values, as a share of a device memcpy ({cd['memcpy_GBps']:.0f} GB/s; "
            "target >= 25 %): "
            + ", ".join(
                f"{r['codec']} enc {100 * r['encode_share_of_memcpy']:.1f} % dec {100 * r['decode_share_of_memcpy']:.1f} %"
                + (
                    f" ({r['fused_path']}; reference enc {100 * r['reference_encode_share_of_memcpy']:.1f} % "
                    f"dec {100 * r['reference_decode_share_of_memcpy']:.1f} %)"
                    if r.get("fused_path")
                    else ""
                )
                + ("" if r["same_as_cpu"] and r.get("same_as_reference", True) else " (NOT the reference's bits)")
                for r in cd["codecs"]
            )
        )
        for c in (c for r in cd["codecs"] for c in r.get("triton_configs", ())):
            shares = f"enc {100 * c.get('encode_share_of_memcpy', 0):.1f} % dec {100 * c.get('decode_share_of_memcpy', 0):.1f} %"
            bits = " (NOT the bits)" if not c.get("same_bits", True) else ""
            lines.append(
                f"  Triton {c['rows']} blocks/program, {c['warps']} warps, maxnreg {c['maxnreg']}: "
                + ("failed" if "error" in c else shares + bits)
            )
    mem = result.get("memory")
    if mem:
        line = (
            f"memory: state on the device, Streaming / DP = {mem['state_ratio']:.3f} (analytic 5/3 = "
            f"{ANALYTIC_STATE_RATIO:.3f}); with offload_device=cpu {mem['state_ratio_offload']:.3f}"
        )
        if "peak_ratio" in mem:
            line += (
                f"; CUDA peak Streaming / DP = {mem['peak_ratio']:.3f} (offload {mem['peak_ratio_offload']:.3f}), "
                f"{mem['peak_vs_predicted']:.3f} of DP's peak + 2 x parameters"
            )
        lines.append(line)
    if result.get("syncer"):
        lines.append(syncer_line(result["syncer"]))
    for phase, error in result.get("errors", {}).items():
        lines.append(f"{phase}: ERROR {error}")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="run every phase on the CPU at toy sizes (no GPU needed)")
    p.add_argument("--skip-suite", action="store_true", help="leave out pytest tests/gpu")
    p.add_argument("--suite-timeout", type=float, default=330.0, help="seconds for pytest tests/gpu (default 330)")
    p.add_argument("--out", type=Path, default=None, help="JSON file (default: benchmarks/results/gpu_check.json)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=530.0,
        help="stop starting phases once this many seconds have passed (default 530: under 9 minutes)",
    )
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        print(
            f"gpu_check: no CUDA GPU visible to torch {torch.__version__} (torch.cuda.is_available() is False): "
            f"nothing measured, nothing written. Run it on a machine with a GPU, or with --dry-run to check the "
            f"script on the CPU.",
            file=sys.stderr,
        )
        return 0
    device = torch.device("cpu" if args.dry_run else "cuda")
    size = SIZES["dry-run" if args.dry_run else "gpu"]
    t0 = time.perf_counter()
    result: dict[str, Any] = {
        "dry_run": args.dry_run,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "sizes": size,
        "errors": {},
    }
    phases = [("suite", lambda: run_suite(args.suite_timeout))] if not args.skip_suite else []
    phases += [
        ("throughput", lambda: run_throughput(device, size)),
        ("codec", lambda: run_codec(device, size)),
        ("memory", lambda: run_memory(device, size)),
        ("syncer", lambda: run_syncer(dry_run=args.dry_run)),  # diloco.bench.gpu_syncer
    ]
    for name, fn in phases:
        if time.perf_counter() - t0 > args.budget_s:
            result["errors"][name] = f"not run: the {args.budget_s:.0f} s budget was spent before it"
            continue
        t = time.perf_counter()
        try:
            result[name] = fn()
        except Exception as exc:
            result["errors"][name] = f"{type(exc).__name__}: {exc}"
        print(f"gpu_check: {name} done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    result["seconds"] = time.perf_counter() - t0
    print("\n".join(summary_lines(result)))
    # default=str: a value JSON has no type for (a path, a dtype) is written as its text, not lost with the run
    write_result(
        "gpu_check-dry-run" if args.dry_run else "gpu_check", json.loads(json.dumps(result, default=str)), out=args.out
    )
    suite_ok = args.skip_suite or result.get("suite", {}).get("ok", False)
    return 0 if suite_ok and not result["errors"] else 1
