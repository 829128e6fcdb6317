"""Tokens per second of a Hugging Face Llama under StreamingDiLoCo against a bare loop of the same model:
the measurement of ``benchmarks/hf_throughput.py`` and of the GPU check's throughput phase.

One replica (M = 1, the in-process communicator), so what is measured is the wrapper's own cost (outer
gradients, FP4 encode / decode, outer Nesterov step, merge), not a network. The two variants alternate
round by round (rounds of H steps, so every round holds the same syncs) so that load from other processes
hits both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time
from functools import partial

import torch

from diloco import StreamingDiLoCo, run_replicas
from diloco.bench import summarize
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace) -> dict:
    """Both variants in alternating rounds of H steps (round 0 warms up); tokens/s of the median and best round."""
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
                sync(device)
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
                sync(device)
                if r > 0:
                    times[name].append(time.perf_counter() - t0)
        return times

    times = run_replicas(replica, 1)[0]
    tokens = args.H * args.batch * args.seq
    timings = {name: summarize(t) for name, t in times.items()}
    rows = {
        name: {"median_tok_s": tokens / t.median, "best_tok_s": tokens / t.min, "round_s": list(t.all)}
        for name, t in timings.items()
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
