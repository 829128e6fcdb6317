"""Two workers across an emulated slow link: measured compute utilization of DP, DiLoCo and Streaming DiLoCo.

Two worker processes, each in its own network namespace, joined by a veth pair
whose two ends are shaped by ``tc`` (tbf: bandwidth; netem: latency, where the
kernel has it). Everything the workers exchange (gloo's all-gathers and the
rendezvous store) crosses that link. The namespaces, the veth pair and the
private addresses (10.213.0.1 / .2) are created by this script and always torn
down, even on error or Ctrl-C. Needs root and iproute2 (``apt-get install -y
iproute2``). If namespaces cannot be created, the workers run on loopback and
a throttle in the communicator sleeps bytes/bandwidth instead: the output says so.

Each worker trains a small transformer (``diloco.models`` size ``cpu-1m``,
vocab 4096, seq 128) on synthetic tokens, one intra-op thread per worker, with:

* DP: gradients all-gathered every step, bf16 on the wire (the papers' 16 bits);
* DiLoCo: H steps, P = 1, bf16;
* Streaming: P fragments (fragment 0 = embeddings/head), tau = 0, bf16;
* +overlap: tau = 1;  +FP4: tau = 1 and the fp4_e3m0 codec.

Compute utilization = time in forward/backward/optimizer / wall time of the
measured window (everything else: waiting on the link, encode/decode, outer
step). Window: H steps after 3 warm-up steps (exactly one sync of every fragment), DP: a few steps.

    sudo .venv/bin/python benchmarks/link.py                 # ~5 minutes on 2 cores
    .venv/bin/python benchmarks/link.py --bandwidths 20 --quick

Prints a table and writes benchmarks/results/link.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ADDRS = ("10.213.0.1", "10.213.0.2")  # private, only inside the two namespaces this script creates
PORT = 29517
METHODS = {  # name -> (algorithm, num_fragments, overlap_steps, codec)
    "DP": ("dp", 1, 0, "bf16"),
    "DiLoCo": ("diloco", 1, 0, "bf16"),
    "Streaming": ("streaming", None, 0, "bf16"),
    "+overlap": ("streaming", None, 1, "bf16"),
    "+overlap+FP4": ("streaming", None, 1, "fp4_e3m0"),
}


# =============================================================================================== the link
class Link:
    """Two namespaces joined by a shaped veth pair; a context manager that always tears down."""

    def __init__(self, latency_ms: float) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"dlk{tag}a", f"dlk{tag}b")
        self.dev = (f"dlkv{tag}a", f"dlkv{tag}b")
        self.latency_ms = latency_ms
        self.notes: list[str] = []

    @staticmethod
    def _run(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    def __enter__(self) -> Link:
        try:
            for ns in self.ns:
                self._run("ip", "netns", "add", ns)
            self._run("ip", "link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
            for ns, dev, addr in zip(self.ns, self.dev, ADDRS, strict=True):
                self._run("ip", "link", "set", dev, "netns", ns)
                self._run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                self._run("ip", "-n", ns, "link", "set", dev, "up")
                self._run("ip", "-n", ns, "link", "set", "lo", "up")
                # Long-lived bulk connections (as between datacenters) keep their congestion window across
                # the idle gaps between syncs; Linux's default would restart slow start after every gap.
                self._run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
        except BaseException:
            self.close()
            raise
        return self

    def shape(self, mbps: float) -> None:
        """Both directions: ``mbps`` Mbit/s (tbf), plus the latency (netem) when asked and available."""
        rate = int(mbps * 1e6)
        burst = max(64 * 1024, rate // 8 // 50)  # >= one GSO packet and ~20 ms of traffic
        for ns, dev in zip(self.ns, self.dev, strict=True):
            base = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root"]
            if self.latency_ms > 0:
                try:
                    self._run(*base, "netem", "delay", f"{self.latency_ms}ms", "rate", f"{rate}bit",
                              "limit", "100000")
                    continue
                except subprocess.CalledProcessError:
                    note = "latency NOT emulated: the kernel has no netem qdisc (bandwidth only, via tbf)"
                    if note not in self.notes:
                        self.notes.append(note)
            self._run(*base, "tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", "100ms")

    def close(self) -> None:
        for ns in self.ns:  # deleting a namespace deletes the veth end inside it, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.dev[0]], capture_output=True)  # if never moved

    def __exit__(self, *exc) -> None:
        self.close()


# ============================================================================================ the worker
class _ThrottledWork:
    def __init__(self, inner, ready_at: float) -> None:
        self.inner, self.ready_at = inner, ready_at

    def wait(self):
        out = self.inner.wait()
        time.sleep(max(0.0, self.ready_at - time.monotonic()))
        return out

    def is_completed(self) -> bool:
        return self.inner.is_completed() and time.monotonic() >= self.ready_at


def throttle(comm, mbps: float, latency_ms: float):
    """Fallback link: an exchange of n bytes finishes (M-1) n * 8 / bandwidth after the link is free."""
    state = {"free_at": 0.0}
    start = comm._start_all_gather

    def throttled(payload, tag):
        now = time.monotonic()
        state["free_at"] = max(now, state["free_at"]) + (comm.world_size - 1) * payload.numel() * 8 / (mbps * 1e6)
        return _ThrottledWork(start(payload, tag), state["free_at"] + latency_ms / 1e3)

    comm._start_all_gather = throttled
    return comm


def _tx_bytes(dev: str | None) -> int:
    if dev is None:
        return 0
    return int(Path(f"/sys/class/net/{dev}/statistics/tx_bytes").read_text())


def probe_overlap(comm, mbps: float) -> dict:
    """Does an async gloo all-gather progress while this process computes? ~1 s of traffic vs ~1 s of matmuls."""
    import torch

    payload = torch.randint(0, 255, (int(min(mbps * 1e6 / 8, 40e6)),), dtype=torch.uint8)
    a = torch.randn(256, 256)
    reps = 1
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.2:
        a @ a
        reps += 1
    reps = int(reps * 5)  # ~1 s

    def compute() -> None:
        for _ in range(reps):
            a @ a

    def timed(fn) -> float:  # median of three, each started together on both ranks
        times = []
        for _ in range(3):
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    def both() -> None:
        work = comm.all_gather_async(payload, tag="probe")
        compute()
        work.wait()

    t_comm = timed(lambda: comm.all_gather_async(payload, tag="probe").wait())
    t_compute = timed(compute)
    t_both = timed(both)
    hidden = (t_comm + t_compute - t_both) / min(t_comm, t_compute)
    return {"payload_bytes": payload.numel(), "comm_s": t_comm, "compute_s": t_compute, "overlapped_s": t_both,
            "serial_s": t_comm + t_compute, "fraction_hidden": hidden,
            "effective_mbps": payload.numel() * 8 / t_comm / 1e6}  # one payload each way, both ways at once


def run_method(comm, name: str, args, dev: str | None) -> dict:
    import torch

    from diloco.algorithm.data_parallel import DataParallel
    from diloco.algorithm.streaming import StreamingDiLoCo
    from diloco.models import Transformer, make_config

    kind, P, tau, codec = METHODS[name]
    P = args.fragments if P is None else P
    torch.manual_seed(0)
    model = Transformer(make_config(args.size, vocab_size=args.vocab, seq_len=args.seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if kind == "dp":
        algo = DataParallel(model, comm=comm, codec=codec)
        warmup, measured = 1, args.dp_steps
    else:
        algo = StreamingDiLoCo(model, comm=comm, sync_every=args.H, num_fragments=P, overlap_steps=tau,
                               codec=codec)
        warmup, measured = 3, args.H  # the window of H steps holds exactly one sync of every fragment
    gen = torch.Generator().manual_seed(comm.rank)
    compute = 0.0
    comm.barrier()
    for step in range(1, warmup + measured + 1):
        if step == warmup + 1:
            compute, sent0, tx0, t_start = 0.0, comm.stats.bytes_sent, _tx_bytes(dev), time.perf_counter()
        x = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen)
        t0 = time.perf_counter()
        _, loss = model(x, x.roll(-1, dims=1))
        loss.backward()
        compute += time.perf_counter() - t0
        if kind == "dp":
            algo.sync_gradients()
        t0 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        compute += time.perf_counter() - t0
        algo.step()
    wall = time.perf_counter() - t_start
    n_params = sum(p.numel() for p in model.parameters())
    non_block = n_params - sum(p.numel() for p in model.blocks.parameters())
    return {"method": name, "kind": kind, "H": 1 if kind == "dp" else args.H, "P": P, "tau": tau, "codec": codec,
            "bits": algo.codec.bits_per_value, "steps": measured, "compute_s": compute, "wall_s": wall,
            "utilization": compute / wall, "s_per_step": wall / measured,
            "compute_s_per_step": compute / measured, "bytes_sent": comm.stats.bytes_sent - sent0,
            "wire_tx_bytes": _tx_bytes(dev) - tx0, "num_params": n_params, "non_block_params": non_block,
            "num_layers": len(model.blocks)}


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from diloco.comm.torch_dist import TorchDistCommunicator

    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    store = dist.TCPStore(args.addr, args.port, world_size=2, is_master=args.rank == 0,
                          timeout=timedelta(seconds=120))
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=2, timeout=timedelta(seconds=900))
    comm = TorchDistCommunicator(timeout_s=900, heartbeat_s=0)  # no heartbeat traffic on the measured link
    if args.throttle:
        throttle(comm, args.mbps, args.latency_ms)
    dev = None if args.throttle else args.ifname
    out = {"rank": args.rank, "probe": probe_overlap(comm, args.mbps), "runs": []}
    for name in args.methods.split(","):
        out["runs"].append(run_method(comm, name, args, dev))
        print(f"  [rank {args.rank}] {name}: {out['runs'][-1]['utilization']:.1%}", file=sys.stderr, flush=True)
    comm.barrier()
    Path(args.json_out).write_text(json.dumps(out))
    dist.destroy_process_group()


# ====================================================================================== the orchestrator
def launch(args, mbps: float, link: Link | None, tmp: Path) -> list[dict]:
    procs, outs = [], []
    for rank in range(2):
        out = tmp / f"bw{mbps:g}_rank{rank}.json"
        cmd = [sys.executable, __file__, "--worker", "--rank", str(rank), "--mbps", str(mbps),
               "--json-out", str(out), "--methods", args.methods, "--H", str(args.H),
               "--fragments", str(args.fragments), "--dp-steps", str(args.dp_steps), "--size", args.size,
               "--batch", str(args.batch), "--seq", str(args.seq), "--vocab", str(args.vocab),
               "--latency-ms", str(args.latency_ms)]
        if link is not None:
            cmd = ["ip", "netns", "exec", link.ns[rank]] + cmd + ["--addr", ADDRS[0], "--ifname", link.dev[rank]]
        else:
            cmd += ["--addr", "127.0.0.1", "--ifname", "lo", "--throttle"]
        procs.append(subprocess.Popen(cmd))
        outs.append(out)
    try:
        for p in procs:
            if p.wait(timeout=1200) != 0:
                raise RuntimeError(f"a worker failed (exit code {p.returncode}); see its output above")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [json.loads(o.read_text()) for o in outs]


def predict(run: dict, mbps: float, latency_ms: float) -> float | None:
    try:
        from diloco.sim import predict_utilization
    except ImportError:
        return None
    return predict_utilization(
        method=run["kind"], num_params=run["num_params"], num_layers=run["num_layers"],
        step_time_s=run["compute_s_per_step"], bandwidth_bps=mbps * 1e6, latency_s=latency_ms / 1e3,
        sync_every=run["H"], num_fragments=run["P"], overlap_steps=run["tau"], bits=run["bits"], num_workers=2,
        non_block_params=run["non_block_params"],
        # DataParallel and StreamingDiLoCo exchange whole payloads after the step, not layer by layer
        overlap_backward=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bandwidths", default="20,100,1000", help="Mbit/s, comma-separated")
    ap.add_argument("--latency-ms", type=float, default=0.0, help="one-way delay per direction (needs netem)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--H", type=int, default=24, help="sync_every for the DiLoCo methods")
    ap.add_argument("--fragments", type=int, default=3, help="P for Streaming (fragment 0 = non-block params)")
    ap.add_argument("--dp-steps", type=int, default=4)
    ap.add_argument("--size", default="cpu-1m")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="H=8, 2 DP steps (smoke run)")
    ap.add_argument("--force-throttle", action="store_true", help="skip namespaces; use the in-process throttle")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "link.json"))
    ap.add_argument("--repredict", action="store_true",
                    help="no training: recompute the simulator's predictions for the measurements in --out "
                         "(after a change to the simulator) and print the table again")
    # worker-only
    for flag in ("--rank", "--mbps", "--json-out", "--addr", "--ifname"):
        ap.add_argument(flag, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=PORT, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--throttle", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.rank, args.mbps = int(args.rank), float(args.mbps)
        worker(args)
        return 0
    if args.repredict:
        return _repredict(Path(args.out))
    if args.quick:
        args.H, args.dp_steps = 8, 2
    bandwidths = [float(b) for b in args.bandwidths.split(",")]
    # SIGTERM takes the same path as Ctrl-C, so the with/finally clauses below tear the link down
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _orchestrate(args, bandwidths)
    except KeyboardInterrupt:
        print("interrupted: workers killed, namespaces and veth pair removed", file=sys.stderr)
        return 130


def _repredict(path: Path) -> int:
    if not path.exists():
        raise SystemExit(f"--repredict: {path} does not exist; run the benchmark first (sudo, ~5 min)")
    saved = json.loads(path.read_text())
    latency = saved["config"].get("latency_ms", 0.0)
    for r in saved["rows"]:
        r["predicted_utilization"] = predict(r, r["mbps"], latency)
        r["predicted_utilization_effective"] = predict(r, r["effective_mbps"], latency)
    args = argparse.Namespace(**saved["config"] | {"out": str(path)})
    probes = {float(k): v for k, v in saved["overlap_probe"].items()}
    report(saved["rows"], probes, saved["notes"], args)
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _orchestrate(args, bandwidths: list[float]) -> int:
    notes: list[str] = []
    link: Link | None = None
    with tempfile.TemporaryDirectory() as tmpdir, contextlib.ExitStack() as cleanup:
        if args.force_throttle:
            notes.append("namespaces skipped (--force-throttle): THROTTLE IN THE COMMUNICATOR, not a real link")
        elif os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
            notes.append("no root or no iproute2: THROTTLE IN THE COMMUNICATOR (sleep bytes/bandwidth), not a link")
        else:
            try:
                link = cleanup.enter_context(Link(args.latency_ms))  # torn down on any exit from this block
            except (subprocess.CalledProcessError, OSError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                notes.append(f"network namespaces unavailable ({detail.strip()}): THROTTLE IN THE COMMUNICATOR")
        rows, probes = [], {}
        for mbps in bandwidths:
            if link is not None:
                link.shape(mbps)
            print(f"== {mbps:g} Mbit/s", file=sys.stderr, flush=True)
            results = launch(args, mbps, link, Path(tmpdir))
            probes[mbps] = results[0]["probe"]
            for i, run in enumerate(results[0]["runs"]):
                mates = [r["runs"][i] for r in results]
                util = sum(m["utilization"] for m in mates) / 2
                rows.append(run | {"mbps": mbps, "utilization": util,
                                   "s_per_step": max(m["s_per_step"] for m in mates),
                                   "utilization_per_rank": [m["utilization"] for m in mates],
                                   "predicted_utilization": predict(run, mbps, args.latency_ms),
                                   "effective_mbps": probes[mbps]["effective_mbps"],
                                   "predicted_utilization_effective": predict(
                                       run, probes[mbps]["effective_mbps"], args.latency_ms)})
        if link is not None:
            notes += link.notes
    report(rows, probes, notes, args)
    return 0


def report(rows: list[dict], probes: dict, notes: list[str], args) -> None:
    r0 = rows[0]
    print(f"\nmodel {args.size}: {r0['num_params'] / 1e6:.2f}M params ({r0['num_layers']} blocks), batch "
          f"{args.batch}x{args.seq}, 2 workers x 1 thread; DiLoCo H={args.H}, Streaming P={args.fragments}")
    for n in notes:
        print(f"NOTE: {n}")
    print("\noverlap probe (async all-gather of ~1 s of traffic while ~1 s of matmuls run; medians of 3):")
    for mbps, p in probes.items():
        print(f"  {mbps:>7g} Mbit/s: comm {p['comm_s']:.2f} s (effective {p['effective_mbps']:.1f} Mbit/s each way), "
              f"compute {p['compute_s']:.2f} s, serial {p['serial_s']:.2f} s, overlapped {p['overlapped_s']:.2f} s "
              f"-> {p['fraction_hidden']:.0%} of the shorter one hidden")
    print(f"\n{'Mbit/s':>7} {'method':<13} {'util':>6} {'sim':>6} {'sim@eff':>7} {'s/step':>7} {'MB sent':>8} "
          f"{'MB wire':>8}")

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    for r in rows:
        wire = f"{r['wire_tx_bytes'] / 1e6:.2f}" if r["wire_tx_bytes"] else "-"
        print(f"{r['mbps']:>7g} {r['method']:<13} {r['utilization']:>6.1%} {pct(r['predicted_utilization']):>6} "
              f"{pct(r['predicted_utilization_effective']):>7} {r['s_per_step']:>7.3f} {r['bytes_sent'] / 1e6:>8.2f} "
              f"{wire:>8}")
    print("util: measured compute time / wall time, mean of the 2 workers. sim: diloco.sim.predict_utilization at\n"
          "the measured compute time per step and the configured bandwidth; sim@eff: at the bandwidth the probe\n"
          "measured (both with overlap_backward=False: exchanges after the step, as the trainer does). MB sent:\n"
          "logical payload per worker in the window; MB wire: bytes that left the worker's veth (TCP/IP headers\n"
          "and store traffic included).")
    for key, label in (("predicted_utilization", "configured"), ("predicted_utilization_effective", "effective")):
        gaps = [(r, 100 * (r[key] - r["utilization"])) for r in rows if r.get(key) is not None]
        if gaps:
            misses = ", ".join(f"{r['method']} at {r['mbps']:g} ({g:+.1f})" for r, g in gaps if abs(g) > 5)
            print(f"simulator within 5 points of the measurement at the {label} bandwidth: "
                  f"{sum(abs(g) <= 5 for _, g in gaps)}/{len(gaps)} rows" + (f"; misses: {misses}" if misses else ""))
    verdict = None
    for mbps in sorted({r["mbps"] for r in rows}):
        by = {r["method"]: r["utilization"] for r in rows if r["mbps"] == mbps}
        if "DP" in by and "+overlap+FP4" in by and by["DP"] <= 0.20:
            verdict = (mbps, by["DP"], by["+overlap+FP4"])
    if verdict:
        mbps, dp, fp4 = verdict
        ok = "MET" if fp4 >= 0.95 else "NOT MET"
        print(f"\ntarget (DP <= 20% and Streaming+overlap+FP4 >= 95% at one bandwidth): {ok} at {mbps:g} Mbit/s: "
              f"DP {dp:.1%}, Streaming+overlap+FP4 {fp4:.1%}")
    else:
        print("\ntarget: no bandwidth in the sweep brings DP to <= 20%; add a lower one")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"config": {k: v for k, v in vars(args).items() if k not in (
        "rank", "mbps", "json_out", "addr", "ifname", "port", "worker", "throttle")}, "notes": notes,
        "overlap_probe": {str(k): v for k, v in probes.items()}, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
