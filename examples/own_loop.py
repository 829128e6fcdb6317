"""Your own loop: Streaming DiLoCo around your model and your data, in 30 lines of training code.

A character-level model (bytes in, next byte out) of your own design, trained on your text with
Streaming DiLoCo (2 fragments, overlap 1 step, 4-bit outer gradients). Two replicas, either as
threads of this process or as torchrun processes; each reads its own part of the text.

    python examples/own_loop.py                                # 2 replicas as threads, standard-library docs as text
    python examples/own_loop.py --text my_notes/ --steps 300   # your .txt/.md files
    torchrun --nproc-per-node 2 examples/own_loop.py           # one replica per process (gloo on CPU)
"""

from __future__ import annotations

import argparse
import copy
import os
import pydoc
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from diloco import StreamingDiLoCo, run_replicas, setup_communicators


class ResidualMLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(F.gelu(self.fc1(self.norm(h))))


class ByteModel(nn.Module):
    """Predicts the next byte from the previous ``context`` bytes: embeddings, a stack of blocks, a head."""

    def __init__(self, context: int = 16, d: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(256, d)
        self.mix = nn.Linear(context * d, d)
        self.layers = nn.ModuleList(ResidualMLP(d) for _ in range(depth))  # the fragmenter splits these
        self.head = nn.Linear(d, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [batch, context] byte ids
        h = self.mix(self.embed(x).flatten(1))
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def load_text(path: str | None) -> bytes:
    if path is None:  # real English text that every Python has: the docs of a few standard modules
        return "\n".join(
            pydoc.render_doc(m, renderer=pydoc.plaintext) for m in ("argparse", "json", "pathlib")
        ).encode()
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.suffix in (".txt", ".md")) if p.is_dir() else [p]
    if not files:
        raise SystemExit(f"--text {path}: no .txt or .md file there")
    return b"\n".join(f.read_bytes() for f in files)


def batches(data: torch.Tensor, rank: int, world: int, *, batch: int, context: int, seed: int):
    """Replica ``rank`` reads its own contiguous part of the text, in a seeded random order."""
    part = data[rank * len(data) // world : (rank + 1) * len(data) // world]
    g = torch.Generator().manual_seed(seed + rank)
    while True:
        starts = torch.randint(0, len(part) - context - 1, (batch,), generator=g)
        windows = torch.stack([part[s : s + context + 1] for s in starts.tolist()])
        yield windows[:, :-1], windows[:, -1]


def replica(comm, args: argparse.Namespace, train: torch.Tensor, val: torch.Tensor) -> dict:
    torch.manual_seed(0)  # the same initial model everywhere (StreamingDiLoCo also broadcasts replica 0's)
    model = ByteModel(args.context)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    algo = StreamingDiLoCo(
        model,
        comm=comm,
        sync_every=args.sync_every,
        num_fragments=2,
        overlap_steps=1,
        merge_alpha=0.5,
        codec="fp4_e3m0",
    )
    data = batches(train, comm.rank, comm.world_size, batch=32, context=args.context, seed=1)
    for step in range(1, args.steps + 1):
        x, y = next(data)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        algo.step()  # starts / finishes the fragment syncs the schedule says
        if comm.rank == 0 and (step % 50 == 0 or step == args.steps):
            print(f"step {step:4d}  replica-0 loss {loss.item():.3f}")
    algo.flush()  # the last exchanges still in flight
    evaluator = copy.deepcopy(model)
    evaluator.load_state_dict(algo.global_state_dict())  # evaluate the global (outer) parameters
    with torch.no_grad():
        x = torch.stack([val[i : i + args.context] for i in range(0, len(val) - args.context - 1, 7)])
        y = torch.stack([val[i + args.context] for i in range(0, len(val) - args.context - 1, 7)])
        val_loss = F.cross_entropy(evaluator(x), y).item()
    return {"val_loss": val_loss, "bytes_sent": comm.stats.bytes_sent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--text", default=None, help="a .txt/.md file or a folder of them (default: Python docs)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sync-every", type=int, default=20)
    parser.add_argument("--context", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = torch.tensor(list(load_text(args.text)), dtype=torch.long)
    cut = int(0.95 * len(data))
    train, val = data[:cut], data[cut:]
    if "RANK" in os.environ:  # under torchrun: one replica per process
        with setup_communicators(timeout_s=120) as comms:
            out = replica(comms.replica, args, train, val)
            lead = comms.is_lead
    else:
        out, lead = run_replicas(lambda comm: replica(comm, args, train, val), 2)[0], True
    if lead:
        print(
            f"held-out loss of the global model: {out['val_loss']:.3f} nats/byte "
            f"(uniform guess: {torch.log(torch.tensor(256.0)).item():.3f}); sent {out['bytes_sent']} bytes/replica"
        )


if __name__ == "__main__":
    main()
