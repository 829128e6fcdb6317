"""Accuracy and speed of the outer-gradient codecs, and why fp4 uses block 16 with an E4M3 scale.

Three tables:
1. relative L2 error ||decode(encode(x)) - x|| / ||x|| of every codec on N(0, 1), on a heavy-tailed
   Student-t (3 degrees of freedom) and on a real outer gradient (a cpu-1m transformer's
   parameters before minus after 30 AdamW steps, taken after 30 warm-up steps, on a synthetic
   Markov-chain token stream);
2. the fp4 scaling ablation at <= 4.5 bits per value: OCP MX (block 32, power-of-two E8M0
   scale), a bf16 scale per 32, and this package's two-level scaling at block 32 / 16 with and
   without the candidate-scale search (the MX and bf16 variants are simulated with the same
   element rounding);
3. encode / decode throughput on this machine's CPU.

    .venv/bin/python benchmarks/codecs.py            # ~1-2 minutes on 2 cores
    .venv/bin/python benchmarks/codecs.py --quick    # smoke run (smaller tensors, no model)

Prints the tables and writes benchmarks/results/codecs.json.
"""

from __future__ import annotations

import argparse
import platform
from collections.abc import Callable
from pathlib import Path

import torch

from diloco.bench import time_it, write_result
from diloco.wire.registry import CODEC_NAMES, get_codec
from diloco.wire.scaled import FP4Codec, FP4E2M1Codec, FP4E3M0Codec


def rel_error(x: torch.Tensor, y: torch.Tensor) -> float:
    return float((y.double() - x.double()).norm() / x.double().norm())


def outer_gradient(steps: int = 30, warmup: int = 30, seed: int = 0) -> torch.Tensor:
    """theta(t) - theta(t + H) of a cpu-1m transformer trained with AdamW (what DiLoCo encodes)."""
    from diloco.models import Transformer, make_config

    vocab, seq, batch = 256, 64, 16
    g = torch.Generator().manual_seed(seed)
    # A sparse random Markov chain: learnable structure, so the updates are a real model's.
    nxt = torch.randint(0, vocab, (vocab, 4), generator=g)

    def tokens() -> torch.Tensor:
        out = torch.empty(batch, seq + 1, dtype=torch.long)
        out[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
        for t in range(seq):
            out[:, t + 1] = nxt[out[:, t], torch.randint(0, 4, (batch,), generator=g)]
        return out

    torch.manual_seed(seed)
    model = Transformer(make_config("cpu-1m", vocab_size=vocab, seq_len=seq))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    before = None
    for step in range(warmup + steps):
        if step == warmup:
            before = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
        batch_tokens = tokens()
        _, loss = model(batch_tokens[:, :-1], batch_tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad()
    after = torch.cat([p.detach().flatten() for p in model.parameters()])
    return before - after


# -- fp4 scaling variants simulated with the codecs' element rounding -----------------------------------
def fake_quant(codec: FP4Codec, x: torch.Tensor, block: int, scale: str) -> torch.Tensor:
    """Quantise-dequantise x with one scale per block: "e8m0_floor" (OCP MX: 2^(floor(log2 amax) -
    emax_elem), clipping), "e8m0_ceil" (smallest power of two that clips nothing) or "bf16" (amax / m
    rounded up to bf16)."""
    m = codec.element_max
    xb = torch.nn.functional.pad(x, (0, -x.numel() % block)).view(-1, block)
    amax = xb.abs().amax(dim=1, keepdim=True)
    if scale == "e8m0_floor":
        emax = torch.floor(torch.log2(torch.tensor(m)))
        s = torch.exp2(torch.floor(torch.log2(amax)) - emax)
    elif scale == "e8m0_ceil":
        s = torch.exp2(torch.ceil(torch.log2(amax / m)))
    elif scale == "bf16":
        exact = amax / m
        s = exact.to(torch.bfloat16)
        s = torch.where(s.float() < exact, torch.nextafter(s, torch.tensor(float("inf"), dtype=s.dtype)), s)
        s = s.float()
    else:
        raise ValueError(f"unknown scale {scale!r}")
    s = torch.where(amax > 0, s, 1.0)
    y = (xb / s).clamp(-m, m)
    return (codec.dequantize_elements(codec.quantize_elements(y)) * s).flatten()[: x.numel()]


def ablation_rows(data: dict[str, torch.Tensor]) -> list[dict]:
    rows = []
    for cls in (FP4E3M0Codec, FP4E2M1Codec):
        base = cls()
        variants: list[tuple[str, float, Callable[[torch.Tensor], torch.Tensor]]] = [
            ("OCP MX: block 32, E8M0 floor (clips)", 4.25, lambda x: fake_quant(base, x, 32, "e8m0_floor")),
            ("block 32, E8M0 no-clip", 4.25, lambda x: fake_quant(base, x, 32, "e8m0_ceil")),
            ("block 32, bf16 no-clip", 4.5, lambda x: fake_quant(base, x, 32, "bf16")),
        ]
        for block, cands in ((32, 1), (32, 4), (16, 1), (16, 4)):
            codec = cls(block_size=block, scale_candidates=cands)
            label = f"two-level: block {block}, E4M3, {cands} cand." + (
                " (default)" if (block, cands) == (16, 4) else ""
            )
            variants.append((label, codec.bits_per_value, lambda x, c=codec: c.decode(c.encode(x), x.numel())))
        for label, bits, fn in variants:
            row = {"format": base.name, "scaling": label, "bits_per_value": bits}
            row.update({k: rel_error(x, fn(x)) for k, x in data.items()})
            rows.append(row)
    return rows


def timed(fn: Callable[[], object], repeats: int) -> float:
    return time_it(fn, repeats=repeats, warmup=1).median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--numel", type=int, default=1 << 20)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="64k elements, 2 repeats, no model")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "codecs.json")
    args = ap.parse_args()
    if args.quick:
        args.numel, args.repeats = 1 << 16, 2
    torch.manual_seed(0)
    n = args.numel
    data = {"normal": torch.randn(n), "student_t3": torch.distributions.StudentT(3.0).sample((n,))}
    if not args.quick:
        data["outer_grad"] = outer_gradient()
    names = {"normal": "N(0,1)", "student_t3": "Student-t(3)", "outer_grad": "outer grad"}

    codec_rows = []
    for name in CODEC_NAMES:
        codec = get_codec(name)
        row = {
            "codec": name,
            "bits_per_value": codec.bits_per_value,
            "bytes_for_1M": codec.num_bytes(1 << 20),
            "x_fewer_than_fp32": 32 / codec.bits_per_value,
        }
        row.update({k: rel_error(x, codec.decode(codec.encode(x), x.numel())) for k, x in data.items()})
        x = data["normal"]
        payload = codec.encode(x)
        row["encode_melem_per_s"] = n / timed(lambda: codec.encode(x), args.repeats) / 1e6
        row["decode_melem_per_s"] = n / timed(lambda: codec.decode(payload, n), args.repeats) / 1e6
        codec_rows.append(row)
    ablation = ablation_rows(data)

    cols = list(data)
    print(
        f"\nrelative L2 error on {n:,} elements"
        + (f" (outer grad: {data['outer_grad'].numel():,})" if "outer_grad" in data else "")
    )
    print(
        f"{'codec':<10} {'bits':>5} {'vs fp32':>8} "
        + " ".join(f"{names[c]:>13}" for c in cols)
        + f" {'enc Mel/s':>10} {'dec Mel/s':>10}"
    )
    for r in codec_rows:
        print(
            f"{r['codec']:<10} {r['bits_per_value']:>5.2f} {r['x_fewer_than_fp32']:>7.2f}x "
            + " ".join(f"{r[c]:>13.5f}" for c in cols)
            + f" {r['encode_melem_per_s']:>10.1f} {r['decode_melem_per_s']:>10.1f}"
        )
    print("\nfp4 scaling ablation (relative L2 error)")
    print(f"{'format':<9} {'scaling':<47} {'bits':>5} " + " ".join(f"{names[c]:>13}" for c in cols))
    for r in ablation:
        print(
            f"{r['format']:<9} {r['scaling']:<47} {r['bits_per_value']:>5.2f} "
            + " ".join(f"{r[c]:>13.4f}" for c in cols)
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "numel": n,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "quick": args.quick,
    }
    write_result("codecs", {"meta": meta, "codecs": codec_rows, "fp4_ablation": ablation}, out=args.out)


if __name__ == "__main__":
    main()
