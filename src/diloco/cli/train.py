"""`diloco train`: one training run from a preset, in one process or under torchrun."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from diloco.cli._common import add_config_args, cache_dir, load_preset, overrides, resolve


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train", help="train one configuration (dp, diloco or streaming)",
        description="Train one configuration. In one process the M replicas are threads (in-process "
                    "communicator); under torchrun each process is one replica (torch.distributed: gloo on "
                    "CPU, nccl on GPU), e.g. `torchrun --nproc-per-node 2 -m diloco train --preset demo "
                    "--method diloco`, or with --set ranks_per_worker=R one of R data-parallel ranks of a "
                    "replica (launch replicas x R processes). Writes config.json, metrics.jsonl, summary.json "
                    "and checkpoints/ to --out. Checkpoints: by default every 100 steps, rounded up to a "
                    "multiple of sync_every for diloco/streaming (--set checkpoint_every=N steps; 0 = only at "
                    "the end), keeping the last 2 (--set keep_checkpoints=K); a killed run continues with "
                    "--resume, from the newest readable checkpoint. An --out that holds another run is "
                    "refused, naming the settings that differ.",
    )
    add_config_args(p, default_preset="demo")
    p.add_argument("--method", default=None,
                   help="one of the preset's named methods (e.g. dp, diloco, streaming, diloco-m1); "
                        "default: the preset's base config")
    p.add_argument("--out", type=Path, default=None, help="output directory (default: runs/<preset>-<method>)")
    p.add_argument("--resume", action="store_true",
                   help="continue exactly from the newest readable checkpoint in --out (a damaged newest one is "
                        "skipped, and said so); a finished run is left as it is")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run --out holds (deletes its config.json, metrics.jsonl, summary.json, "
                        "checkpoints/ and tb/); without it such an --out is an error")
    p.add_argument("--device", default=None, help="torch device (default: cuda:LOCAL_RANK if available, else cpu)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="under torchrun: seconds to wait for a peer before stopping with an error that names "
                        "the missing rank (default: 300)")
    p.set_defaults(func=run)


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def run(args: argparse.Namespace) -> int:
    from diloco.train.trainer import Trainer

    preset = load_preset(args.preset)
    cfg = resolve(preset, args.method, overrides(args))
    name = Path(args.preset).stem
    out = args.out or Path("runs") / f"{name}-{args.method or cfg.method}"
    if not _under_torchrun():
        trainer = Trainer(cfg, out, cache_dir=cache_dir(args), progress=not args.no_progress,
                          device=args.device or "cpu")
        print(json.dumps(trainer.run(resume=args.resume, overwrite=args.overwrite).to_dict(), indent=2))
        return 0

    import torch
    import torch.distributed as dist

    from diloco.comm.torch_dist import TorchDistCommunicator
    from diloco.distributed.launch import init_from_env

    env = init_from_env(timeout_s=max(1800.0, 2 * args.timeout))
    device = args.device or (f"cuda:{env.local_rank}" if torch.cuda.is_available() else "cpu")
    comms: list = []  # every communicator this process opened, closed at the end
    try:
        workers, R = cfg.replicas, cfg.ranks_per_worker
        if env.world_size != workers * R:
            raise ValueError(f"{env.world_size} processes were launched but replicas x ranks_per_worker = "
                             f"{workers} x {R} = {workers * R}; launch {workers * R} processes or change "
                             f"--set replicas=... / --set ranks_per_worker=...")
        intra = None
        if R == 1:
            comm = TorchDistCommunicator(timeout_s=args.timeout)
            comms.append(comm)
        else:  # workers of R consecutive ranks (one worker per node with --nproc-per-node R)
            from diloco.comm.mesh import build_layout

            comm = build_layout(workers, R).communicator(timeout_s=args.timeout)
            intra = comm.intra  # the worker's own group: gradients are averaged over it every step
            comms += [comm.cross, comm.intra]
        trainer = Trainer(cfg, out, cache_dir=cache_dir(args), progress=not args.no_progress, device=device)
        result = trainer.run_replica(comm, resume=args.resume, overwrite=args.overwrite, intra=intra)
        if result is not None:
            print(json.dumps(result.to_dict(), indent=2))
    finally:
        for c in comms:
            c.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
