"""What the simulator predicts for the slow-link benchmark's measurements, and the table it prints.

Used by ``benchmarks/link.py`` (after a run, and for ``--repredict``, which recomputes the predictions of a
saved run after a change to the simulator without training again).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from diloco.bench import write_result


def predict(run: dict, mbps: float, latency_ms: float) -> float | None:
    """``diloco.sim.predict_utilization`` for the run. The simulator charges each worker's link the
    all-reduce figure 2(M-1)/M per parameter bit (``sim/hardware.py``), the reduce-scatter's; for a
    run that did the all-gather, its bits are scaled by the all-gather's (M-1) over that figure
    (``diloco.traffic.exchange_bytes``), so the simulator sees the bytes that crossed the link."""
    try:
        from diloco.sim import predict_utilization
        from diloco.traffic import exchange_bytes
    except ImportError:
        return None
    m = run.get("workers", 2)
    ran = run.get("exchange", "all_gather")
    scale = (
        (
            exchange_bytes(payload_bytes=1.0, num_replicas=m, exchange=ran)
            / exchange_bytes(payload_bytes=1.0, num_replicas=m, exchange="reduce_scatter")
        )
        if m > 1
        else 1.0
    )
    return predict_utilization(
        method=run["kind"],
        num_params=run["num_params"],
        num_layers=run["num_layers"],
        step_time_s=run["compute_s_per_step"],
        bandwidth_bps=mbps * 1e6,
        latency_s=latency_ms / 1e3,
        sync_every=run["H"],
        num_fragments=run["P"],
        overlap_steps=run["tau"],
        bits=run["bits"] * scale,
        num_workers=m,
        eager=run.get("eager", False),
        non_block_params=run["non_block_params"],
        # DataParallel and StreamingDiLoCo exchange whole payloads after the step, not layer by layer
        overlap_backward=False,
    )


def exchange_mbps(probe: dict, run: dict, mbps: float) -> float | None:
    """The rate the run's exchange really achieved alone (the exchange probe, M > 2): bytes / seconds."""
    e = probe.get("exchanges", {}).get(run.get("exchange"))
    return None if e is None else mbps * e["link_s"] / e["s"]


def with_predictions(run: dict, probe: dict, mbps: float, latency_ms: float) -> dict:
    xmbps = exchange_mbps(probe, run, mbps)
    return {
        "predicted_utilization": predict(run, mbps, latency_ms),
        "effective_mbps": probe["effective_mbps"],
        "predicted_utilization_effective": predict(run, probe["effective_mbps"], latency_ms),
        "exchange_mbps": xmbps,
        "predicted_utilization_exchange": None if xmbps is None else predict(run, xmbps, latency_ms),
    }


def repredict(path: Path) -> int:
    if not path.exists():
        raise SystemExit(f"--repredict: {path} does not exist; run the benchmark first (sudo, ~5 min)")
    saved = json.loads(path.read_text())
    latency = saved["config"].get("latency_ms", 0.0)
    probes = {float(k): v for k, v in saved["overlap_probe"].items()}
    for r in saved["rows"]:
        r.update(with_predictions(r, probes[float(r["mbps"])], r["mbps"], latency))
    args = argparse.Namespace(**saved["config"] | {"out": str(path)})
    report(saved["rows"], probes, saved["notes"], args)
    return 0


def report(rows: list[dict], probes: dict, notes: list[str], args) -> None:
    r0 = rows[0]
    print(
        f"\nmodel {args.size}: {r0['num_params'] / 1e6:.2f}M params ({r0['num_layers']} blocks), batch "
        f"{args.batch}x{args.seq}, {getattr(args, 'workers', 2)} workers x 1 thread; DiLoCo H={args.H}, "
        f"Streaming P={args.fragments}"
    )
    for n in notes:
        print(f"NOTE: {n}")
    print("\noverlap probe (async all-gather of ~1 s of traffic while ~1 s of matmuls run; medians of 3):")
    for mbps, p in probes.items():
        print(
            f"  {mbps:>7g} Mbit/s: comm {p['comm_s']:.2f} s (effective {p['effective_mbps']:.1f} Mbit/s each way), "
            f"compute {p['compute_s']:.2f} s, serial {p['serial_s']:.2f} s, overlapped {p['overlapped_s']:.2f} s "
            f"-> {p['fraction_hidden']:.0%} of the shorter one hidden"
        )
        for ex, e in p.get("exchanges", {}).items():
            print(
                f"           one bf16 exchange of the model alone, {ex}: {e['s']:.2f} s for "
                f"{e['bytes_each_way'] / 1e6:.2f} MB each way ({e['link_s']:.2f} s at the configured rate)"
            )
    width = max(13, *(len(r["method"]) for r in rows))
    xchg = any(r.get("predicted_utilization_exchange") is not None for r in rows)
    print(
        f"\n{'Mbit/s':>7} {'method':<{width}} {'util':>6} {'sim':>6} {'sim@eff':>7} "
        + (f"{'sim@xchg':>8} " if xchg else "")
        + f"{'s/step':>7} {'MB sent':>8} {'MB wire':>8} {'cores':>5}"
    )

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    for r in rows:
        wire = f"{r['wire_tx_bytes'] / 1e6:.2f}" if r["wire_tx_bytes"] else "-"
        print(
            f"{r['mbps']:>7g} {r['method']:<{width}} {r['utilization']:>6.1%} {pct(r['predicted_utilization']):>6} "
            f"{pct(r['predicted_utilization_effective']):>7} "
            + (f"{pct(r.get('predicted_utilization_exchange')):>8} " if xchg else "")
            + f"{r['s_per_step']:>7.3f} {r['bytes_sent'] / 1e6:>8.2f} {wire:>8} "
            + (f"{r['cores_used']:>5.2f}" if "cores_used" in r else f"{'-':>5}")
        )
    print(
        "util: measured compute time / wall time, mean of the workers. sim: diloco.sim.predict_utilization at\n"
        "the measured compute time per step and the configured bandwidth; sim@eff: at the bandwidth the probe\n"
        "measured (both with overlap_backward=False: exchanges after the step, as the trainer does). MB sent:\n"
        "what the communicator counted leaving each worker in the window (diloco.traffic); MB wire: bytes\n"
        "that left the worker's veth (TCP/IP headers and store traffic included). M > 2: the simulator\n"
        "charges 2(M-1)/M per bit; all-gather rows scale the bits to its (M-1). sim@xchg (M > 2): at the rate\n"
        "the run's exchange achieved alone in the exchange probe. cores: CPU seconds of all the workers'\n"
        f"threads / wall (this machine has {os.cpu_count()}); compute "
        + (f"emulated by a {args.compute_s:g} s sleep per step" if getattr(args, "compute_s", 0) else "real")
        + "."
    )
    for key, label in (
        ("predicted_utilization", "configured"),
        ("predicted_utilization_effective", "effective"),
        ("predicted_utilization_exchange", "exchange probe's"),
    ):
        gaps = [(r, 100 * (r[key] - r["utilization"])) for r in rows if r.get(key) is not None]
        if gaps:
            misses = ", ".join(f"{r['method']} at {r['mbps']:g} ({g:+.1f})" for r, g in gaps if abs(g) > 5)
            print(
                f"simulator within 5 points of the measurement at the {label} bandwidth: "
                f"{sum(abs(g) <= 5 for _, g in gaps)}/{len(gaps)} rows" + (f"; misses: {misses}" if misses else "")
            )
    verdict = None
    for mbps in sorted({r["mbps"] for r in rows}):
        by = {r["method"]: r["utilization"] for r in rows if r["mbps"] == mbps}
        if "DP" in by and "+overlap+FP4" in by and by["DP"] <= 0.20:
            verdict = (mbps, by["DP"], by["+overlap+FP4"])
    if verdict:
        mbps, dp, fp4 = verdict
        ok = "MET" if fp4 >= 0.95 else "NOT MET"
        print(
            f"\ntarget (DP <= 20% and Streaming+overlap+FP4 >= 95% at one bandwidth): {ok} at {mbps:g} Mbit/s: "
            f"DP {dp:.1%}, Streaming+overlap+FP4 {fp4:.1%}"
        )
    elif any(r["method"] == "DP" for r in rows):
        print("\ntarget: no bandwidth in the sweep brings DP to <= 20%; add a lower one")
    write_result(
        "link",
        {
            "config": {
                k: v
                for k, v in vars(args).items()
                if k not in ("rank", "mbps", "json_out", "addr", "ifname", "port", "worker", "throttle")
            },
            "notes": notes,
            "overlap_probe": {str(k): v for k, v in probes.items()},
            "rows": rows,
        },
        out=args.out,
    )
