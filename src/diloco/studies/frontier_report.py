"""The bandwidth frontier: each method at its best inner lr against DP at its best, beside what it sends (the
report of studies/frontier, run as its report.py):

    .venv/bin/python studies/frontier/report.py            # table; frontier-summary.json and frontier.png
    .venv/bin/python studies/frontier/report.py --planner cpu-1m   # also: the planner charges that size's rows
    .venv/bin/python studies/frontier/report.py --planner cpu-1m --batch 64   # ... at that global batch (default 16)
    .venv/bin/python studies/frontier/report.py --planner cpu-1m --batch 128 --device cuda   # ... of the GPU runs

Reads studies/frontier/results.jsonl (``diloco sweep`` over the grids of write_grids.py, on the CPU) and
results-gpu.jsonl (gpu_grids.py: the same runs on one CUDA GPU), and each run's summary.json (bytes sent) where a
record lacks them. The two devices are two sets: every comparison is within one device (a run's final loss moves
with rounding as it moves with the seed). For every (size, device, global batch, method) it takes the inner lr with
the lowest seed-0 loss and says whether it sits at the edge of those tried; where more seeds ran at that lr, the
row's loss is their mean (``seeds``, ``eval_loss_sd`` beside it) and every gap is between such means.
Columns: the gap to the best DP at the same size and batch; bits per parameter per sync (the codec's exact
payload for the whole model, over its parameter count); bytes sent per replica over the run; the latency
an exchange may take without stalling (tau inner steps); how often each value is sent over the run (outer
syncs times top-k's density); and, beside every gap, the papers' scaling law for
DiLoCo M = 2 at this N (their Table 4 fitted and extrapolated: the reference this model size sets).
The two targets: eager (tau = H) within 0.5 points of Streaming tau = 1; some codec at <= 0.5 bits per
parameter within 0.3 points of FP4 Streaming. A missing run is reported as missing, never as met.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

from diloco.files import atomic_write_bytes, read_jsonl, write_json
from diloco.models import count_params, make_config
from diloco.scaling.paper_gap import paper_law_gaps
from diloco.studies.frontier import HERE, METHODS, method_name
from diloco.traffic import exchange_bytes
from diloco.train.sweep_runner import device_of
from diloco.wire.registry import get_codec

ROOT = HERE.parents[1]

STREAMING, EAGER = "streaming-fp4-tau1", ("eager-fp4-mom0.9", "eager-fp4-mom0.5")
RESULTS = (HERE / "results.jsonl", HERE / "results-gpu.jsonl")  # the CPU runs, the GPU runs (gpu_grids.py)


def bits_per_param(rec: dict, total_params: int) -> float:
    if rec["method"] == "dp":
        return 32.0  # fp32 gradients, every step
    codec = get_codec(
        rec["base"].get("codec", "fp32"),
        topk_density=rec["base"].get("topk_density"),
        topk_tables=rec["base"].get("topk_tables"),
    )
    return 8 * codec.num_bytes(total_params) / total_params


def total_params(rec: dict) -> int:
    """Every parameter of the run's model (embeddings too): from the record, else from its size and vocab."""
    if rec.get("total_params"):
        return rec["total_params"]
    base = rec["base"]
    return count_params(make_config(rec["size"], vocab_size=base["vocab_size"], seq_len=base["seq_len"]))


def run_costs(rec: dict, earlier: dict[tuple, dict]) -> dict:
    """Steps, parameters and bytes sent per replica: the record's (sweeps since these fields), the run folder's
    summary.json, or the row an earlier report wrote for this run (a run folder not on this machine)."""
    if rec.get("bytes_sent_per_replica") is not None:
        return {k: rec[k] for k in ("steps", "total_params", "bytes_sent_per_replica")}
    path = ROOT / rec["run_dir"] / "summary.json"
    if path.exists():
        summary = json.loads(path.read_text())
        return {
            "steps": summary["steps"],
            "total_params": summary["num_params"],
            "bytes_sent_per_replica": summary["bytes_sent_per_replica"],
        }
    row = earlier.get(_row_key(rec["size"], rec["global_batch"], method_name(rec), rec["inner_lr"], rec["eval_loss"]))
    return {
        "steps": None,
        "total_params": total_params(rec),
        "bytes_sent_per_replica": None if row is None or rec["method"] == "dp" else row["bytes_sent_per_replica"],
        "dp_bytes_at_m2": None if row is None or rec["method"] != "dp" else row["bytes_sent_per_replica"],
    }


def sends_per_value(rec: dict) -> float | None:
    """How often each value is sent over the run, on average: every outer sync of its fragment (steps / H) times
    the share of values a payload carries (top-k's density, 1 for dense codecs). None for data-parallel.
    Top-k's error feedback only delays what it drops; below about one send per value, most of an outer
    gradient is never sent at all within the run's budget."""
    if rec["method"] == "dp":
        return None
    base = rec["base"]
    steps = rec["tokens"] // (rec["global_batch"] * base["seq_len"])
    density = (base.get("topk_density") or 1 / 64) if base.get("codec") == "topk" else 1.0
    return steps / rec["sync_every"] * density


def _row_key(size: str, batch: int, method: str, inner_lr: float, eval_loss: float) -> tuple:
    return size, batch, method, inner_lr, round(eval_loss, 6)


def _dp_bytes_at_m2(costs: dict) -> float | None:
    """DP over M = 2 sends fp32 gradients every step (as the trainer's DP at M = 2 does); the sweep runs DP with
    one replica, which sends nothing, so its bytes are counted by the traffic function."""
    if not costs.get("total_params") or not costs.get("steps"):
        return costs.get("dp_bytes_at_m2")
    return costs["steps"] * exchange_bytes(
        payload_bytes=4 * costs["total_params"], num_replicas=2, exchange="all_gather"
    )


#: The rows the planner charges (diloco.sim.loss: MEASURED_CODECS, MEASURED_EAGER, the reference and DP), and
#: how it names them.
PLANNER_ROWS = {
    "dp": "data-parallel (AdamW)",
    "streaming-fp4-tau1": "Streaming FP4, tau = 1",
    "eager-fp4-mom0.5": "eager FP4, tau = H, outer momentum 0.5",
    "stat4-ef0.9": "stat4 + error feedback 0.9",
    "stat2-ef0.9": "stat2 + error feedback 0.9",
    "topk-sparseloco": "SparseLoCo top-k 1/64 + 2-bit, error feedback",
    "muon-stat4-ef0.9": "Muon inner + stat4 + error feedback 0.9 (vs AdamW DP)",
}
#: Shown by `diloco plan`, charged to nothing: copied when measured.
PLANNER_OPTIONAL = ("muon-stat4-ef0.9",)
PLANNER_DATA = ROOT / "src" / "diloco" / "sim" / "data" / "ablations.json"


def planner_block(rows: list[dict], size: str, batch: int = 16, device: str = "cpu") -> dict:
    """The planner's measured costs (ablations.json's "frontier") from this report's rows at one size, batch and
    device. Every row the planner charges must be there: a partial study is refused, naming what is missing."""
    have = {
        r["method"]: r
        for r in rows
        if r["size"] == size and r["global_batch"] == batch and r.get("device", "cpu") == device
    }
    missing = [k for k in PLANNER_ROWS if k not in have and k not in PLANNER_OPTIONAL]
    if missing:
        raise ValueError(
            f"--planner {size}: no finished run of {', '.join(missing)} at batch {batch} on {device}; "
            f"the planner's costs stay as they are"
        )
    n = have["dp"]["num_params"]
    seeds = sorted({have[k].get("seeds", 1) for k in PLANNER_ROWS if k in have})
    return {
        "_comment": "Copied from the file named in source by `report.py --planner SIZE` (the global batch "
        f"{batch} rows; tests/unit/test_plan_measured.py checks the copy): what the planner charges "
        "the newer bandwidth settings, measured at laptop scale.",
        "source": "studies/frontier/frontier-summary.json",
        "setting": f"{size} ({n:,} parameters), global batch {batch} x 128, M = 2, H = 30, P = 3, 20 tokens per "
        f"parameter, each method at its best inner lr, "
        + ("one seed" if seeds == [1] else f"the mean over the seeds run there ({seeds[0]} to {seeds[-1]})")
        + ("" if device == "cpu" else f", on one {device.upper()} GPU"),
        "size": size,
        "global_batch": batch,
        "num_params": n,
        "reference": STREAMING,
        **({} if device == "cpu" else {"device": device}),
        "rows": {
            k: {
                "what": what,
                "eval_loss": have[k]["eval_loss"],
                "gap_pct": have[k]["gap_pct"],
                "tolerated_steps": have[k]["tolerated_steps"],
            }
            for k, what in PLANNER_ROWS.items()
            if k in have
        },
    }


def _chosen_by(row: dict) -> float:
    """The loss a batch or lr is chosen on: seed 0's, as every bracket was run; the row's mean over more seeds is
    what is reported (choosing on a mean of more seeds at one point than at its rivals would favour the noisier)."""
    return row.get("eval_loss_seed0", row["eval_loss"])


def best_over_batches(rows: list[dict], size: str, device: str = "cpu") -> dict[str, dict]:
    """Each method's best row at ``size`` over the batches tried, with ``batches_tried`` and whether the best
    batch sits at an edge of them (``batch_at_edge``) or is the only one (``one_batch``); its ``gap_pct`` is
    against data-parallel at DP's best batch (a row's own ``gap_pct`` is against DP at the row's batch)."""
    best: dict[str, dict] = {}
    batches: dict[str, set] = defaultdict(set)
    for r in rows:
        if r["size"] == size and r.get("device", "cpu") == device:
            batches[r["method"]].add(r["global_batch"])
            if r["method"] not in best or _chosen_by(r) < _chosen_by(best[r["method"]]):
                best[r["method"]] = r
    out = {}
    dp = best.get("dp")  # the reference of this table: data-parallel at its own best batch and lr
    for name, r in sorted(best.items()):
        tried = sorted(batches[name])
        out[name] = {
            **r,
            "batches_tried": tried,
            "one_batch": len(tried) == 1,
            "batch_at_edge": len(tried) > 1 and r["global_batch"] in (tried[0], tried[-1]),
            "gap_pct": None if dp is None else 100 * (r["eval_loss"] / dp["eval_loss"] - 1),
        }
    return out


def target_verdict(r: dict, streaming: dict, points: float) -> str:
    """``r``'s gap to DP against Streaming FP4's, in points, judged against ``points``; without a DP run at that
    size, only the two losses' ratio (the target is in points of the gap to DP: not judged)."""
    if r["gap_pct"] is None or streaming["gap_pct"] is None:
        return (
            f"{100 * (r['eval_loss'] / streaming['eval_loss'] - 1):+.2f}% in loss against Streaming tau = 1; "
            f"no DP run at this size yet, so the target (<= +{points} points of the gap to DP) is not judged"
        )
    d = r["gap_pct"] - streaming["gap_pct"]
    noise = ""
    if r.get("seeds", 1) > 1 and streaming.get("seeds", 1) > 1:  # the standard error of the two means, in points
        dp_loss = r["eval_loss"] / (1 + r["gap_pct"] / 100)
        se = 100 * (r["eval_loss_sd"] ** 2 / r["seeds"] + streaming["eval_loss_sd"] ** 2 / streaming["seeds"]) ** 0.5
        noise = f" +- {se / dp_loss:.2f} (standard error over {r['seeds']} and {streaming['seeds']} seeds)"
    loose = []
    for x in (r, streaming):
        what = [
            k
            for k, bad in (("lr", x["at_edge"] or x["one_lr"]), ("batch", x.get("batch_at_edge") or x.get("one_batch")))
            if bad
        ]
        if what:
            loose.append(f"{x['method']} ({' and '.join(what)})")
    caveat = f"; not bracketed: {', '.join(loose)}" if loose else ""
    return (
        f"{r['gap_pct']:+.2f}% vs Streaming tau = 1 {streaming['gap_pct']:+.2f}%: {d:+.2f}{noise} points -> "
        f"{'met' if d <= points else 'MISSED'} (target <= +{points}{caveat})"
    )


def write_planner_block(block: dict) -> None:
    """Replace ablations.json's "frontier" block (its last key), keeping the rest of the file's text as written."""
    text = PLANNER_DATA.read_text()
    start = text.index('\n  "frontier": {')
    assert list(json.loads(text))[-1] == "frontier", "the frontier block must stay the file's last key"
    head = {k: v for k, v in block.items() if k != "rows"}
    lines = [f"    {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    rows = [f"      {json.dumps(k)}: {json.dumps(v)}" for k, v in block["rows"].items()]
    new = (
        text[:start]
        + '\n  "frontier": {\n'
        + "\n".join(lines)
        + '\n    "rows": {\n'
        + ",\n".join(rows)
        + "\n    }\n  }\n}\n"
    )
    assert json.loads(new)["frontier"] == block
    atomic_write_bytes(PLANNER_DATA, new.encode("utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report.py", description="The bandwidth frontier's table, summary and plot.")
    parser.add_argument(
        "--planner", metavar="SIZE", help="also write the planner's measured costs from SIZE's rows (e.g. cpu-1m)"
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=None,
        metavar="B",
        help="with --planner: the global batch whose rows the planner charges (default 16)",
    )
    parser.add_argument(
        "--device",
        default=None,
        choices=("cpu", "cuda"),
        help="with --planner: the device whose runs the planner charges (default cpu)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.batch is not None and args.planner is None:
        parser.error(f"--batch {args.batch} only chooses the rows of --planner SIZE; add --planner SIZE")
    if args.device is not None and args.planner is None:
        parser.error(f"--device {args.device} only chooses the rows of --planner SIZE; add --planner SIZE")
    if args.batch is not None and args.batch < 1:
        parser.error(f"--batch {args.batch}: a global batch is a positive number of sequences, e.g. --batch 64")
    planner_batch = 16 if args.batch is None else args.batch
    device = args.device or "cpu"
    records = [
        r
        for path in RESULTS
        if path.exists()
        for r in read_jsonl(path)
        if r.get("status") == "ok" and r.get("eval_loss")
    ]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["size"], device_of(r), r["global_batch"], method_name(r))].append(r)
    earlier_path = HERE / "frontier-summary.json"
    earlier = {
        _row_key(r["size"], r["global_batch"], r["method"], r["inner_lr"], r["eval_loss"]): r
        for r in (json.loads(earlier_path.read_text())["rows"] if earlier_path.exists() else [])
    }
    rows = []
    for (size, dev, batch, name), rs in sorted(groups.items()):
        first = [r for r in rs if r.get("seed", 0) == 0] or rs  # the lr is chosen on one seed, as it was bracketed
        best = min(first, key=lambda r: r["eval_loss"])
        lrs = sorted(r["inner_lr"] for r in first)
        at_best = [r["eval_loss"] for r in rs if r["inner_lr"] == best["inner_lr"]]
        costs = run_costs(best, earlier)
        rows.append(
            {
                "size": size,
                **({} if dev == "cpu" else {"device": dev}),
                "global_batch": batch,
                "method": name,
                "inner_lr": best["inner_lr"],
                "lrs_tried": lrs,
                "at_edge": len(lrs) > 1 and best["inner_lr"] in (lrs[0], lrs[-1]),
                "one_lr": len(set(lrs)) == 1,
                "eval_loss": statistics.fmean(at_best),
                "num_params": best["num_params"],
                **(
                    {}
                    if len(at_best) == 1
                    else {
                        "seeds": len(at_best),
                        "eval_loss_sd": statistics.stdev(at_best),
                        "eval_loss_seed0": best["eval_loss"],
                    }
                ),
                "bits_per_param_per_sync": bits_per_param(best, costs["total_params"]),
                "bytes_sent_per_replica": (
                    _dp_bytes_at_m2(costs) if METHODS[name][0] == "dp" else costs["bytes_sent_per_replica"]
                ),
                "tolerated_steps": (0 if METHODS[name][0] == "dp" else METHODS[name][2].get("overlap_steps", 0)),
                "sends_per_value": sends_per_value(best),
            }
        )
    dp_at = {(d["size"], d.get("device", "cpu"), d["global_batch"]): d for d in rows if d["method"] == "dp"}
    for r in rows:  # against DP at its best lr at the same size, device and batch
        dp = dp_at.get((r["size"], r.get("device", "cpu"), r["global_batch"]))
        r["gap_pct"] = None if dp is None else 100 * (r["eval_loss"] / dp["eval_loss"] - 1)
        r["papers_law_m2_gap_pct"] = paper_law_gaps(r["num_params"])[2]
    print(
        f"{'size':<9} {'dev':<4} {'B':>3} {'method':<19} {'lr':>6} {'loss':>7} {'gap':>8} {'law M=2':>8} "
        f"{'bits/p/sync':>11} {'sent/replica':>13} {'tau':>4} {'sends/value':>11}  seeds"
    )
    for r in rows:
        gap = "-" if r["gap_pct"] is None else f"{r['gap_pct']:+.2f}%"
        bits = "-" if r["bits_per_param_per_sync"] is None else f"{r['bits_per_param_per_sync']:.3f}"
        sent = "-" if r["bytes_sent_per_replica"] is None else f"{r['bytes_sent_per_replica'] / 1e6:.1f} MB"
        edge = "*" if r["at_edge"] else "?" if r["one_lr"] else " "
        seeds = f"  {r['seeds']}, sd {r['eval_loss_sd']:.4f}" if r.get("seeds") else ""
        print(
            f"{r['size']:<9} {r.get('device', 'cpu'):<4} {r['global_batch']:>3} {r['method']:<19} "
            f"{r['inner_lr']:>6g}{edge}{r['eval_loss']:>7.4f} "
            f"{gap:>8} {r['papers_law_m2_gap_pct']:>+7.2f}% {bits:>11} {sent:>13} {r['tolerated_steps']:>4} "
            f"{'-' if r['sends_per_value'] is None else format(r['sends_per_value'], '.1f'):>11}{seeds}"
        )
    print("* the best inner lr sits at the edge of what was tried: bracket it further")
    print("? only one inner lr was tried: not bracketed")
    print("\nEach method at its best batch and inner lr (gap against DP at its best; batches tried, the best in []):")
    sets = sorted({(r["size"], r.get("device", "cpu")) for r in rows})
    for size, dev in sets:
        for r in best_over_batches(rows, size, dev).values():
            flag = "*" if r["at_edge"] or r["batch_at_edge"] else "?" if r["one_lr"] or r["one_batch"] else " "
            tried = " ".join(f"[{b}]" if b == r["global_batch"] else str(b) for b in r["batches_tried"])
            seeds = f"  ({r['seeds']} seeds, sd {r['eval_loss_sd']:.4f})" if r.get("seeds") else ""
            print(
                f"  {size:<9} {dev:<4} {r['method']:<19} {flag} {r['eval_loss']:.4f} {r['gap_pct']:+7.2f}%  "
                f"lr {r['inner_lr']:g}  batch {tried}{seeds}"
            )
    print("  * / ?: the best batch or inner lr at an edge of those tried / only one tried")
    print("\nTargets (per size and device, best over batches):")
    for size, dev in sets:
        best = best_over_batches(rows, size, dev)
        size = f"{size} ({dev})"
        s = best.get(STREAMING)
        eager = [best[e] for e in EAGER if e in best]
        if s and eager:
            e = min(eager, key=lambda r: r["eval_loss"])
            print(f"  {size}: eager (tau = H) {target_verdict(e, s, 0.5)}")
        else:
            print(f"  {size}: eager vs Streaming: not yet measured")
        low = [
            r for r in best.values() if r["bits_per_param_per_sync"] is not None and r["bits_per_param_per_sync"] <= 0.5
        ]
        if s and low:
            c = min(low, key=lambda r: r["eval_loss"])
            print(
                f"  {size}: best codec at <= 0.5 bits/param ({c['method']}, {c['bits_per_param_per_sync']:.3f}) "
                f"{target_verdict(c, s, 0.3)}"
            )
        else:
            print(f"  {size}: a codec at <= 0.5 bits/param vs FP4 Streaming: not yet measured")
        muon, dp_muon = best.get("muon-stat4-ef0.9"), best.get("dp-muon")
        if muon and dp_muon:  # the fair reference for Muon + error feedback: data-parallel with Muon
            print(
                f"  {size}: Muon + stat4 EF {100 * (muon['eval_loss'] / dp_muon['eval_loss'] - 1):+.2f}% against "
                f"data-parallel with Muon (AdamW Streaming FP4 against AdamW DP: "
                f"{'-' if s is None else format(s['gap_pct'], '+.2f') + '%'})"
            )
    block = None
    if args.planner:  # refused before anything is written: a partial study leaves every file as it was
        try:
            block = planner_block(rows, args.planner, planner_batch, device)
        except ValueError as exc:
            print(f"report.py: {exc}", file=sys.stderr)
            return 2
    write_json(HERE / "frontier-summary.json", {"rows": rows})
    _plot(rows)
    if block is not None:
        write_planner_block(block)
        print(
            f"\nwrote the planner's measured costs ({args.planner}, batch {planner_batch}, {device}) into "
            f"{PLANNER_DATA.relative_to(ROOT) if PLANNER_DATA.is_relative_to(ROOT) else PLANNER_DATA}"
        )
    return 0


def _plot(rows: list[dict]) -> None:
    """frontier.png beside the summary (:func:`diloco.studies.frontier_plot.plot_frontier`)."""
    from diloco.studies.frontier_plot import plot_frontier

    plot_frontier(rows, HERE / "frontier.png")
