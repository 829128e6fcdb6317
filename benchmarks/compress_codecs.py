"""The compressing codecs (stat2, stat4, topk) beside the wire formats: bits, error, bytes at cpu-1m.

For each codec:

* bits per value: ``8 * num_bytes(n) / n`` for one payload of the ``cpu-1m`` model's
  parameters (one fragment: plain DiLoCo);
* relative L2 error of one encode/decode of 1M N(0, 1) values (top-k's is large by
  design: it sends 1/64 of the values; error feedback sends the rest later);
* the range r of the statistical quantizer: the relative error for r in
  {1.5, 2, 2.5, 3, 4, 6}, which chose the defaults (2 for stat2, 2.5 for stat4);
* bytes per parameter each worker sends per sync at M = 2, 4, 8, with the exchange the
  communicator runs (reduce-scatter above M = 2, all-gather for sparse top-k).

    .venv/bin/python benchmarks/compress_codecs.py     # ~10 s

Prints tables and writes benchmarks/results/compress_codecs.json.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from diloco.bench import write_result
from diloco.comm.exchange import link_bytes, resolve_exchange
from diloco.models.factory import build_model
from diloco.traffic import default_exchange
from diloco.wire.compress import StatisticalCodec
from diloco.wire.registry import get_codec

CODECS = ("fp32", "bf16", "fp4_e3m0", "stat4", "stat2", "topk")
WORKERS = (2, 4, 8)


def relative_error(codec, x: torch.Tensor) -> float:
    y = codec.decode(codec.encode(x), x.numel())
    return float((y - x).norm() / x.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="cpu-1m")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "compress_codecs.json")
    args = ap.parse_args()

    model = build_model("", size=args.size, vocab_size=4096, seq_len=128, seed=0)
    n = sum(p.numel() for p in model.parameters())
    x = torch.randn(1 << 20, generator=torch.Generator().manual_seed(0))
    rows = []
    print(f"{args.size}: {n:,} parameters, one payload per sync")
    print(
        f"{'codec':10s} {'bits/value':>10s} {'rel. L2 err':>11s}  "
        + "  ".join(f"{'B/param sent, M=' + str(m):>24s}" for m in WORKERS)
    )
    for name in CODECS:
        codec = get_codec(name)
        row = {
            "codec": name,
            "payload_bytes": codec.num_bytes(n),
            "bits_per_value": 8 * codec.num_bytes(n) / n,
            "relative_l2_error": relative_error(codec, x),
            "sent_bytes_per_param": {},
        }
        for m in WORKERS:
            ex = resolve_exchange(default_exchange(m), num_replicas=m, numel=n, codec=codec)
            row["sent_bytes_per_param"][m] = {
                "exchange": ex,
                "bytes": link_bytes(codec, numel=n, num_replicas=m, exchange=ex, rank=0).sent / n,
            }
        rows.append(row)
        sent = "  ".join(
            f"{row['sent_bytes_per_param'][m]['bytes']:8.4f} {row['sent_bytes_per_param'][m]['exchange']:>15s}"
            for m in WORKERS
        )
        print(f"{name:10s} {row['bits_per_value']:10.4f} {row['relative_l2_error']:11.4f}  {sent}")
    ranges = {}
    print("\nstatistical quantizer, relative L2 error by range r (sigmas)")
    for bits in (2, 4):
        ranges[bits] = {
            r: relative_error(StatisticalCodec(bits=bits, range_sigmas=r), x) for r in (1.5, 2.0, 2.5, 3.0, 4.0, 6.0)
        }
        print(f"  {bits}-bit: " + "  ".join(f"r={r:g}: {e:.4f}" for r, e in ranges[bits].items()))
    write_result(
        "compress_codecs",
        {"size": args.size, "num_params": n, "codecs": rows, "stat_range_error": ranges},
        out=args.out,
    )


if __name__ == "__main__":
    main()
