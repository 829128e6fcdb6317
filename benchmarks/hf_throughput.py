"""Tokens per second of a Hugging Face Llama under StreamingDiLoCo against a bare loop of the same model.

The issue's goal: a ~100M-parameter HF Llama in bf16 under ``StreamingDiLoCo`` (H = 30, P = 4,
tau = 1, FP4 outer gradients) at >= 0.95x the bare loop's tokens/s. One replica (M = 1, the
in-process communicator), so what is measured is the wrapper's own cost (outer gradients, FP4
encode / decode, outer Nesterov step, merge), not a network. The two variants alternate round by
round (rounds of H steps, so every round holds the same syncs) so that load from other processes
hits both alike; the table gives the median and the best round.

    .venv/bin/python benchmarks/hf_throughput.py --preset tiny --rounds 4           # CPU smoke run (seconds)
    .venv/bin/python benchmarks/hf_throughput.py --preset 100m --device cuda --bf16 # the issue's measurement

Prints a table and writes benchmarks/results/hf_throughput-<preset>-<device>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from diloco import StreamingDiLoCo, run_replicas
from diloco.models.hf import build_hf_model

PRESETS = {
    # ~0.4M parameters at vocab 4096: a CPU smoke run
    "tiny": {
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
    },
    # ~110M parameters at vocab 32768 (GPT-2-small-like width and depth, Llama blocks)
    "100m": {
        "model_type": "llama",
        "hidden_size": 768,
        "intermediate_size": 2048,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 12,
        "max_position_embeddings": 2048,
    },
}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    fields = PRESETS[args.preset]
    torch.manual_seed(0)
    models = {
        name: build_hf_model(fields, vocab_size=args.vocab, seq_len=args.seq).to(device)
        for name in ("bare", "streaming")
    }
    models["streaming"].load_state_dict(models["bare"].state_dict())
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=device.type == "cuda") for name, m in models.items()}
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, args.vocab, (8, args.batch, args.seq + 1), generator=g).to(device)
    params = sum(p.numel() for p in models["bare"].parameters())
    autocast = partial(torch.autocast, device.type, dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext

    def replica(comm):
        algo = StreamingDiLoCo(
            models["streaming"],
            comm=comm,
            sync_every=args.H,
            num_fragments=args.P,
            overlap_steps=args.tau,
            merge_alpha=0.5,
            codec=args.codec,
        )
        times: dict[str, list[float]] = {"bare": [], "streaming": []}
        step = 0
        for r in range(args.rounds + 1):  # round 0 warms up
            for name in ("bare", "streaming") if r % 2 == 0 else ("streaming", "bare"):
                model, opt = models[name], opts[name]
                _sync(device)
                t0 = time.perf_counter()
                for _ in range(args.H):
                    batch = data[step % len(data)]
                    with autocast():
                        _, loss = model(batch[:, :-1], batch[:, 1:])
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if name == "streaming":
                        algo.step()
                    step += 1
                _sync(device)
                if r > 0:
                    times[name].append(time.perf_counter() - t0)
        return times

    times = run_replicas(replica, 1)[0]
    tokens = args.H * args.batch * args.seq
    rows = {
        name: {"median_tok_s": tokens / statistics.median(t), "best_tok_s": tokens / min(t), "round_s": t}
        for name, t in times.items()
    }
    ratio_median = rows["streaming"]["median_tok_s"] / rows["bare"]["median_tok_s"]
    ratio_best = rows["streaming"]["best_tok_s"] / rows["bare"]["best_tok_s"]
    return {
        "preset": args.preset,
        "params": params,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
        "bf16": args.bf16,
        "vocab": args.vocab,
        "seq": args.seq,
        "batch": args.batch,
        "H": args.H,
        "P": args.P,
        "tau": args.tau,
        "codec": args.codec,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "results": rows,
        "ratio_median": ratio_median,
        "ratio_best": ratio_best,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast")
    p.add_argument("--vocab", type=int, default=None, help="default: 4096 (tiny), 32768 (100m)")
    p.add_argument("--seq", type=int, default=None, help="default: 128 (tiny), 1024 (100m)")
    p.add_argument("--batch", type=int, default=None, help="default: 8 (tiny), 16 (100m)")
    p.add_argument("--H", type=int, default=30)
    p.add_argument("--P", type=int, default=4)
    p.add_argument("--tau", type=int, default=1)
    p.add_argument("--codec", default="fp4_e3m0")
    p.add_argument("--rounds", type=int, default=6, help="timed rounds of H steps per variant")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    big = args.preset == "100m"
    args.vocab = args.vocab or (32768 if big else 4096)
    args.seq = args.seq or (1024 if big else 128)
    args.batch = args.batch or (16 if big else 8)
    out = run(args)
    print(
        f"{out['preset']} HF Llama, {out['params'] / 1e6:.1f}M params, {out['device']} ({out['device_name']}), "
        f"bf16={out['bf16']}, batch {args.batch} x seq {args.seq}, H={args.H} P={args.P} tau={args.tau} {args.codec}"
    )
    print(f"{'variant':<10} {'median tok/s':>14} {'best tok/s':>12}")
    for name, row in out["results"].items():
        print(f"{name:<10} {row['median_tok_s']:>14.0f} {row['best_tok_s']:>12.0f}")
    print(f"streaming / bare: {out['ratio_median']:.3f} (median rounds), {out['ratio_best']:.3f} (best rounds)")
    path = (
        args.out
        or Path(__file__).parent / "results" / f"hf_throughput-{args.preset}-{out['device'].split(':')[0]}.json"
    )
    path.write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
