"""The emulated slow links of the link benchmarks: network namespaces joined by shaped veths, and TCP state.

``Link`` creates M namespaces (10.213.0.x), joined by a veth pair (M = 2) or through a bridge
namespace (M > 2), shapes both ends of every worker's veth (``tbf`` FIFO, or one ``htb`` class per peer,
optionally with small packets first) and always tears everything down. ``ss_snapshot`` /
``SsSampler`` read the connections' TCP state (``ss -tinm``: queues, cwnd, rtt, windows, buffers)
during a run. Used by ``benchmarks/link.py`` (training over the link) and ``benchmarks/link_collectives.py``
(bare collectives). Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import time


def addr(rank: int) -> str:
    """Worker ``rank``'s private address, only inside the namespaces this script creates."""
    return f"10.213.0.{rank + 1}"


SHAPERS = ("tbf", "htb")


# =============================================================================================== the link
class Link:
    """M namespaces joined by shaped veths (a pair for M = 2, a bridge for more); always torn down."""

    def __init__(
        self,
        latency_ms: float,
        workers: int = 2,
        queue_ms: float = 100.0,
        congestion: str | None = None,
        offload: bool = True,
        shaper: str = "tbf",
        ack_priority: bool = False,
        sysctls: dict[str, str] | None = None,
    ) -> None:
        if shaper not in SHAPERS:
            raise ValueError(f"shaper must be one of {SHAPERS}, got {shaper!r}")
        if ack_priority and shaper != "htb":
            raise ValueError("ack_priority needs shaper='htb' (a class of its own for ACKs)")
        tag = f"{os.getpid() % 100000}"
        self.workers = workers
        self.ns = [f"dlk{tag}{chr(97 + i)}" for i in range(workers)]
        self.dev = [f"dlkv{tag}{chr(97 + i)}" for i in range(workers)]
        self.hub_ns = f"dlk{tag}hub" if workers > 2 else None
        self.hub_dev = [f"dlkh{tag}{chr(97 + i)}" for i in range(workers)] if workers > 2 else []
        self.latency_ms = latency_ms
        self.queue_ms = queue_ms
        self.congestion = congestion  # TCP congestion control in the namespaces (None: the host's default)
        self.offload = offload  # False: no TSO/GSO/GRO on the veths, so tbf sees wire-size (MTU) packets
        self.shaper = shaper  # "tbf": one FIFO per link end; "htb": one class (and FIFO) per peer
        self.ack_priority = ack_priority  # htb only: small packets (pure ACKs) in a class of their own, first
        self.sysctls = dict(sysctls or {})  # extra sysctls set inside every worker namespace
        self.notes: list[str] = []

    def shaped(self) -> list[tuple[str, str]]:
        """(namespace, device) of every shaped veth end: each worker's upload, and its download."""
        return list(zip(self.ns, self.dev, strict=True)) + [(self.hub_ns, d) for d in self.hub_dev]

    @staticmethod
    def _run(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    def __enter__(self) -> Link:
        try:
            for ns in self.ns:
                self._run("ip", "netns", "add", ns)
            if self.hub_ns is None:
                self._run("ip", "link", "add", self.dev[0], "type", "veth", "peer", "name", self.dev[1])
            else:
                hub, bridge = self.hub_ns, "br0"
                self._run("ip", "netns", "add", hub)
                self._run("ip", "-n", hub, "link", "add", bridge, "type", "bridge")
                self._run("ip", "-n", hub, "link", "set", bridge, "up")
                for dev, hdev in zip(self.dev, self.hub_dev, strict=True):
                    self._run("ip", "link", "add", dev, "type", "veth", "peer", "name", hdev)
                    self._run("ip", "link", "set", hdev, "netns", hub)
                    self._run("ip", "-n", hub, "link", "set", hdev, "master", bridge)
                    self._run("ip", "-n", hub, "link", "set", hdev, "up")
            for rank, (ns, dev) in enumerate(zip(self.ns, self.dev, strict=True)):
                self._run("ip", "link", "set", dev, "netns", ns)
                self._run("ip", "-n", ns, "addr", "add", f"{addr(rank)}/24", "dev", dev)
                self._run("ip", "-n", ns, "link", "set", dev, "up")
                self._run("ip", "-n", ns, "link", "set", "lo", "up")
                # Long-lived bulk connections (as between datacenters) keep their congestion window across
                # the idle gaps between syncs; Linux's default would restart slow start after every gap.
                self._run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
                if self.congestion:
                    self._run(
                        "ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={self.congestion}"
                    )
                for key, value in self.sysctls.items():
                    self._run("ip", "netns", "exec", ns, "sysctl", "-qw", f"{key}={value}")
            for ns, dev in self.shaped() if not self.offload else ():
                self._run("ip", "netns", "exec", ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off")
        except BaseException:
            self.close()
            raise
        return self

    def shape(self, mbps: float) -> None:
        """Both directions: ``mbps`` Mbit/s (tbf or htb), plus the latency (netem) when asked and available."""
        rate = int(mbps * 1e6)
        burst = max(64 * 1024, rate // 8 // 50)  # >= one GSO packet and ~20 ms of traffic
        for k, (ns, dev) in enumerate(self.shaped()):
            base = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root"]
            if self.latency_ms > 0:
                try:
                    self._run(*base, "netem", "delay", f"{self.latency_ms}ms", "rate", f"{rate}bit", "limit", "100000")
                    continue
                except subprocess.CalledProcessError:
                    note = "latency NOT emulated: the kernel has no netem qdisc (bandwidth only, via tbf)"
                    if note not in self.notes:
                        self.notes.append(note)
            if self.shaper == "htb":
                # the first M ends are the workers' own (upload: classify by destination), the rest the
                # hub's (worker k - M's download: classify by source); for M = 2 both ends are uploads
                upload = k < len(self.ns)
                me = k if upload else k - len(self.ns)
                self._htb(ns, dev, rate, burst, [r for r in range(self.workers) if r != me], upload)
                continue
            self._run(*base, "tbf", "rate", f"{rate}bit", "burst", str(burst), "latency", f"{self.queue_ms:g}ms")

    def _htb(self, ns: str, dev: str, rate: int, burst: int, peers: list[int], upload: bool) -> None:
        """One HTB class per peer (rate = link / peers, ceil = link: an idle peer's share goes to the
        others, and no peer's flow can fill the queue the others wait in), each with a byte FIFO of
        ``queue_ms`` at the link rate; unclassified traffic in a class like a peer's. With
        ``ack_priority`` packets under 128 bytes (pure ACKs, SYNs, the store's small messages) go
        first, in a class of their own (prio 0, ceil = link)."""
        tc = ["ip", "netns", "exec", ns, "tc"]
        limit = max(2 * 64 * 1024, int(rate / 8 * self.queue_ms / 1e3))
        self._run(*tc, "qdisc", "replace", "dev", dev, "root", "handle", "1:", "htb", "default", "ff")
        self._run(
            *tc,
            "class",
            "add",
            "dev",
            dev,
            "parent",
            "1:",
            "classid",
            "1:1",
            "htb",
            "rate",
            f"{rate}bit",
            "ceil",
            f"{rate}bit",
            "burst",
            str(burst),
            "cburst",
            str(burst),
        )
        classes = [(0x10 + p, p) for p in peers] + [(0xFF, None)]
        share = rate // len(classes)
        if self.ack_priority:
            self._run(
                *tc,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:1",
                "classid",
                "1:2",
                "htb",
                "rate",
                f"{max(rate // 20, 8000)}bit",
                "ceil",
                f"{rate}bit",
                "burst",
                str(burst),
                "cburst",
                str(burst),
                "prio",
                "0",
            )
            self._run(*tc, "qdisc", "add", "dev", dev, "parent", "1:2", "pfifo", "limit", "10000")
            # IPv4 total length < 128 bytes (bytes 2-3 of the header): pure ACKs and other small packets
            self._run(
                *tc,
                "filter",
                "add",
                "dev",
                dev,
                "parent",
                "1:",
                "protocol",
                "ip",
                "prio",
                "1",
                "u32",
                "match",
                "u16",
                "0x0000",
                "0xff80",
                "at",
                "2",
                "flowid",
                "1:2",
            )
        for cid, peer in classes:
            self._run(
                *tc,
                "class",
                "add",
                "dev",
                dev,
                "parent",
                "1:1",
                "classid",
                f"1:{cid:x}",
                "htb",
                "rate",
                f"{share}bit",
                "ceil",
                f"{rate}bit",
                "burst",
                str(burst),
                "cburst",
                str(burst),
                "prio",
                "1",
            )
            self._run(*tc, "qdisc", "add", "dev", dev, "parent", f"1:{cid:x}", "bfifo", "limit", str(limit))
            if peer is not None:
                self._run(
                    *tc,
                    "filter",
                    "add",
                    "dev",
                    dev,
                    "parent",
                    "1:",
                    "protocol",
                    "ip",
                    "prio",
                    "2",
                    "u32",
                    "match",
                    "ip",
                    "dst" if upload else "src",
                    f"{addr(peer)}/32",
                    "flowid",
                    f"1:{cid:x}",
                )

    def qdisc_stats(self) -> dict[str, str]:
        """``tc -s qdisc`` of every shaped end (drops, overlimits, backlog), keyed by namespace/device."""
        return {
            f"{ns}/{dev}": subprocess.run(
                ["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", dev], capture_output=True, text=True
            ).stdout
            for ns, dev in self.shaped()
        }

    def close(self) -> None:
        for ns in self.ns + ([self.hub_ns] if self.hub_ns else []):  # a namespace takes its veth ends along
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for dev in self.dev:  # any veth never moved into a namespace
            subprocess.run(["ip", "link", "del", dev], capture_output=True)

    def __exit__(self, *exc) -> None:
        self.close()


# ================================================================================== TCP state (ss -ti)
_SS_KEYS = (
    "cwnd",
    "mss",
    "rcv_space",
    "rcv_ssthresh",
    "snd_wnd",
    "bytes_sent",
    "bytes_acked",
    "bytes_received",
    "retrans_total",
    "unacked",
)


def ss_snapshot(port: int | None = None) -> list[dict]:
    """The TCP connections of this network namespace between the link's addresses (10.213.0.x), from
    ``ss -tinm``: send/receive queues, cwnd (segments) and mss, rtt (ms), the socket buffers (skmem
    ``rb``/``tb``, bytes), rcv_space, the peer's advertised window (snd_wnd) and the cumulative ms the
    connection spent busy, limited by the receiver's window or by its own send buffer. ``port``: leave
    out connections to or from that port (the rendezvous store)."""
    out = subprocess.run(["ss", "-tinmH", "state", "established"], capture_output=True, text=True).stdout
    conns, cur = [], None
    for line in out.splitlines():
        if not line[:1].isspace():  # "Recv-Q Send-Q local peer" (state filtered, so no state column)
            parts = line.split()
            cur = None
            if len(parts) >= 4 and parts[2].startswith("10.213.") and parts[3].startswith("10.213."):
                local, peer = parts[2], parts[3]
                if port is None or not (local.endswith(f":{port}") or peer.endswith(f":{port}")):
                    cur = {"local": local, "peer": peer, "recv_q": int(parts[0]), "send_q": int(parts[1])}
                    conns.append(cur)
            continue
        if cur is None:
            continue
        for tok in line.split():
            key, _, val = tok.partition(":")
            if key == "skmem":
                for item in val.strip("()").split(","):
                    name = item.rstrip("0123456789")
                    if name in ("rb", "tb", "r", "t"):
                        cur[f"skmem_{name}"] = int(item[len(name) :])
            elif key == "rtt":
                cur["rtt_ms"] = float(val.split("/")[0])
            elif key == "minrtt":
                cur["minrtt_ms"] = float(val)
            elif key in ("busy", "rwnd_limited", "sndbuf_limited"):
                cur[f"{key}_ms"] = float(val.split("ms")[0])
            elif key in _SS_KEYS and val:
                with contextlib.suppress(ValueError):
                    cur[key] = int(val.split("/")[-1] if key == "retrans_total" else val)
    return conns


_SERIES = (
    "send_q",
    "recv_q",
    "bytes_acked",
    "bytes_received",
    "cwnd",
    "rtt_ms",
    "snd_wnd",
    "unacked",
    "skmem_r",
    "skmem_rb",
    "skmem_t",
    "rcv_space",
)


class SsSampler:
    """``ss_snapshot`` every ``interval_s`` on a thread while in the ``with`` block; ``summary()`` reduces
    the samples of connections that had bytes queued to send (Send-Q > 0) to medians/maxima, and the
    busy / rwnd_limited / sndbuf_limited ms accumulated between the first and last snapshot."""

    def __init__(self, interval_s: float = 0.05, port: int | None = None) -> None:
        import threading

        self.interval_s, self.port, self.samples = interval_s, port, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), ss_snapshot(self.port)))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> SsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.perf_counter(), ss_snapshot(self.port)))

    def summary(self) -> dict:
        active = [c for _, snap in self.samples for c in snap if c["send_q"] > 0]

        def med(key: str) -> float | None:
            vals = [c[key] for c in active if key in c]
            return statistics.median(vals) if vals else None

        def top(key: str) -> float | None:
            vals = [c[key] for c in active if key in c]
            return max(vals) if vals else None

        first = {(c["local"], c["peer"]): c for c in self.samples[0][1]} if self.samples else {}
        last = {(c["local"], c["peer"]): c for c in self.samples[-1][1]} if self.samples else {}
        limited = {
            k: sum(last[c].get(f"{k}_ms", 0.0) - first[c].get(f"{k}_ms", 0.0) for c in last if c in first)
            for k in ("busy", "rwnd_limited", "sndbuf_limited")
        }
        return {
            "samples": len(self.samples),
            "active_samples": len(active),
            "rtt_ms_median": med("rtt_ms"),
            "rtt_ms_max": top("rtt_ms"),
            "minrtt_ms": med("minrtt_ms"),
            "cwnd_bytes_median": None if med("cwnd") is None else med("cwnd") * (med("mss") or 1448),
            "send_q_median": med("send_q"),
            "send_q_max": top("send_q"),
            "snd_wnd_median": med("snd_wnd"),
            "snd_wnd_max": top("snd_wnd"),
            "unacked_segments_median": med("unacked"),
            "sndbuf_median": med("skmem_tb"),
            "rcvbuf_median": med("skmem_rb"),
            "rcv_space_median": med("rcv_space"),
            "busy_ms": limited["busy"],
            "rwnd_limited_ms": limited["rwnd_limited"],
            "sndbuf_limited_ms": limited["sndbuf_limited"],
            # the raw samples, compact: [s since the first, peer, send_q, recv_q, bytes_acked... ]
            "series_keys": list(_SERIES),
            "series": [
                [round(t - self.samples[0][0], 3), c["peer"]] + [c.get(k) for k in _SERIES]
                for t, snap in self.samples
                for c in snap
            ],
        }


__all__ = ["SHAPERS", "Link", "SsSampler", "addr", "ss_snapshot"]
