"""The sites' link to the syncer service (:mod:`diloco.decoupled.rpc`, gRPC) against Ray's, on this machine's
loopback: what it costs to join, the bytes on the wire per merge against the payload bytes, and a partition.

A syncer actor (one learner, one fragment of an ``nn.Linear(1024, 1024)``, 1.05M values) behind the gateway as
``diloco syncer`` serves it; between the learner and the gateway a TCP relay that counts every byte both ways
and can hold them (a partition: the connection stays up, nothing gets through, as when a WAN link drops packets
and TCP waits).

* *join*: in a fresh process, seconds from before the transport's import to the first answer (gRPC: ``import
  grpc``, a link, a ``Status`` call; Ray: ``import ray``, ``ray.init(address=...)``, ``get_actor``, ``status``),
  and in this process a site's claim and join (``connect_site`` + ``join``: the welcome's 4.2 MB included).
* *wire*: per merge (a report and its reply) the bytes through the relay over the payloads' bytes (the codec's
  report and reply), for FP32 and FP4 (E2M1) payloads; a call's round trip (``Status``) over gRPC and over Ray.
* *partition*: the relay holds everything for ``PARTITION_S``; a report sent then returns at once, ``poll_reply``
  says nothing has come (the learner rides it out, ``ride_out_steps``), and the reply comes after the relay lets
  go; then a partition longer than a channel's ``retry_for`` (``GIVE_UP_S``): seconds until the learner is told.

    python benchmarks/transport.py            # about 1.5 min on 2 cores
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch
from torch import nn

from diloco.bench import add_out, machine, print_table, write_result
from diloco.decoupled.rpc.relay import Relay

PARTITION_S = 3.0
GIVE_UP_S = 5.0
MERGES = 20
TOKEN = "bench-token"


_GRPC_JOIN = """
import sys, time
import torch  # a site's process has it already: not counted
t0 = time.perf_counter()
from diloco.decoupled.rpc.client import Link
from diloco.decoupled.rpc.frames import unpack
link = Link(sys.argv[1], token=sys.argv[2])
unpack(link.call("Status", {"shard": 0}))
print(time.perf_counter() - t0, "ray" in sys.modules)
"""
_RAY_JOIN = """
import sys, time
import torch  # as above
t0 = time.perf_counter()
import ray
ray.init(address=sys.argv[1], namespace="diloco", log_to_driver=False)
actor = ray.get_actor(sys.argv[2], namespace="diloco")
ray.get(actor.status.remote())
print(time.perf_counter() - t0, True)
"""


def _fresh(code: str, *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, check=True)
    return float(out.stdout.split()[-2])


def _round_trip(call, n: int = 50) -> float:
    call()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - t0) / n


def _merges(channel, codec, n: int, version: int) -> tuple[int, int]:
    """``n`` merges of one learner's reports (payloads of ``codec``); the payload bytes, the version reached."""
    from diloco.decoupled.messages import Report

    payload_bytes, g = 0, torch.Generator().manual_seed(0)
    for i in range(n):
        delta = torch.randn(1024 * 1024 + 1024, generator=g) * 1e-3
        report = Report(0, 0, codec.encode(delta), 1, 1.0, 0.01, i + 1, base_version=version)
        channel.send(report)
        reply = channel.wait_reply(0)
        payload_bytes += report.payload.numel() + reply.payload.numel()
        version = reply.version
    return payload_bytes, version


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_out(ap, "transport")
    args = ap.parse_args()
    import ray

    from diloco.decoupled.ray_transport import start_syncer
    from diloco.decoupled.rpc.client import Unreachable, connect_site
    from diloco.decoupled.rpc.frames import unpack
    from diloco.decoupled.rpc.gateway import Gateway, ray_backend
    from diloco.decoupled.syncer import Syncer
    from diloco.wire.registry import get_codec

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, namespace="diloco")
    gcs = ray.get_runtime_context().gcs_address
    rows: list[dict] = []
    try:
        for codec_name in ("fp32", "fp4_e2m1"):
            torch.manual_seed(0)
            name = f"bench-{codec_name}"
            syncer = Syncer(nn.Linear(1024, 1024), num_learners=1, quorum=1, codec=codec_name, merge="mean")
            handle = start_syncer(syncer, name=name)
            ray.get(handle.pid.remote())  # the actor is up: its start is not a join's
            gateway = Gateway(ray_backend([handle], 1), name=name, token=TOKEN, host="127.0.0.1", port=0)
            relay = Relay(gateway.start())
            spec = f"{name}@127.0.0.1:{relay.port}"
            row: dict = {"codec": codec_name}
            if codec_name == "fp32":
                row["join_fresh_grpc_s"] = _fresh(_GRPC_JOIN, spec, TOKEN)
                row["join_fresh_ray_s"] = _fresh(_RAY_JOIN, gcs, name)
            t0 = time.perf_counter()
            channel = connect_site(learner=0, syncer=spec, token=TOKEN, retry_for=60.0)
            welcome = channel.join()
            row["claim_and_join_s"] = time.perf_counter() - t0
            before = relay.total()
            payload, version = _merges(channel, get_codec(codec_name), MERGES, welcome.versions[0])
            row["payload_bytes_per_merge"] = payload / MERGES
            row["wire_bytes_per_merge"] = (relay.total() - before) / MERGES
            row["wire_over_payload"] = row["wire_bytes_per_merge"] / row["payload_bytes_per_merge"]
            row["status_rtt_grpc_ms"] = 1e3 * _round_trip(lambda: unpack(channel.link.call("Status", {"shard": 0})))
            row["status_rtt_ray_ms"] = 1e3 * _round_trip(lambda: ray.get(handle.status.remote()))
            if codec_name == "fp32":  # a partition of PARTITION_S, ridden out
                from diloco.decoupled.messages import Report

                codec = get_codec(codec_name)
                relay.hold()
                t0 = time.perf_counter()
                channel.send(Report(0, 0, codec.encode(torch.zeros(1024 * 1025)), 1, 1.0, 0.01, 99, version))
                row["send_during_partition_ms"] = 1e3 * (time.perf_counter() - t0)
                polls = []
                while time.perf_counter() - t0 < PARTITION_S:
                    polls.append(channel.poll_reply(0) is None)
                    time.sleep(0.1)
                row["polls_empty_during_partition"] = all(polls)
                relay.release()
                healed = time.perf_counter()
                version = channel.wait_reply(0).version
                row["reply_after_heal_s"] = time.perf_counter() - healed
                row["retries"] = channel.link.retries
                channel.link.retries = 0
                # a partition longer than a channel's retry_for: how long until the learner is told
                channel.leave(finished=False)
                short = connect_site(learner=0, syncer=spec, token=TOKEN, retry_for=GIVE_UP_S)
                short.join()
                relay.hold()
                t0 = time.perf_counter()
                short.send(Report(0, 0, codec.encode(torch.zeros(1024 * 1025)), 1, 1.0, 0.01, 100, version + 0))
                try:
                    short.wait_reply(0)
                    row["gave_up_after_s"] = None
                except Unreachable as exc:
                    row["gave_up_after_s"] = time.perf_counter() - t0
                    row["gave_up_message"] = str(exc)[:300]
                relay.release()
                short._stop.set()  # its heartbeat (the learner it stands for gave up)
                row["gave_up_retries"] = short.link.retries
            else:
                channel.leave(finished=False)
            rows.append(row)
            gateway.stop()
            ray.kill(handle)
    finally:
        ray.shutdown()
    print_table(
        rows,
        [
            ("codec", "codec", ""),
            ("join fresh gRPC s", "join_fresh_grpc_s", ".2f"),
            ("join fresh Ray s", "join_fresh_ray_s", ".2f"),
            ("claim+join s", "claim_and_join_s", ".3f"),
            ("payload B/merge", "payload_bytes_per_merge", ".0f"),
            ("wire B/merge", "wire_bytes_per_merge", ".0f"),
            ("wire/payload", "wire_over_payload", ".4f"),
            ("RTT gRPC ms", "status_rtt_grpc_ms", ".2f"),
            ("RTT Ray ms", "status_rtt_ray_ms", ".2f"),
            ("reply after heal s", "reply_after_heal_s", ".2f"),
            ("gave up after s", "gave_up_after_s", ".1f"),
        ],
        title=f"learner-to-syncer transport on loopback (1.05M values a merge; partition {PARTITION_S:g} s; "
        f"retry_for {GIVE_UP_S:g} s)",
    )
    settings = {"merges": MERGES, "values": 1024 * 1025, "partition_s": PARTITION_S, "retry_for_s": GIVE_UP_S}
    write_result("transport", {"machine": machine(), "settings": settings, "rows": rows}, out=args.out)
    json.dumps(rows, allow_nan=False)


if __name__ == "__main__":
    main()
