"""`diloco train`: one training run from a preset, in one process or under torchrun."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from diloco.cli._common import add_config_args, cache_dir, load_preset, overrides, resolve
from diloco.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train one configuration (dp, diloco or streaming)",
        description="Train one configuration. In one process the M replicas are threads (in-process "
        "communicator); under torchrun each process is one replica (torch.distributed: gloo on "
        "CPU, nccl on GPU), e.g. `torchrun --nproc-per-node 2 -m diloco train --preset demo "
        "--method diloco`, or with --set ranks_per_worker=R one of R data-parallel ranks of a "
        "replica (launch replicas x R processes; --set worker_sharding=fsdp shards each replica's "
        "model over its R ranks with FSDP, see docs/guides/fsdp.md). Writes config.json, metrics.jsonl, "
        "summary.json and checkpoints/ to --out. Checkpoints: by default every 100 steps, rounded up to a "
        "multiple of sync_every for diloco/streaming (--set checkpoint_every=N steps; 0 = only at "
        "the end), keeping the last 2 (--set keep_checkpoints=K); a killed run continues with "
        "--resume, from the newest readable checkpoint. An --out that holds another run is "
        "refused, naming the settings that differ.",
    )
    add_config_args(p, default_preset="demo")
    p.add_argument(
        "--method",
        default=None,
        help="one of the preset's named methods (e.g. dp, diloco, streaming, diloco-m1); "
        "default: the preset's base config",
    )
    p.add_argument("--out", type=Path, default=None, help="output directory (default: runs/<preset>-<method>)")
    p.add_argument(
        "--resume",
        nargs="?",
        const="yes",
        choices=("yes", "auto"),
        metavar="auto",
        help="continue exactly from the newest readable checkpoint in --out (a damaged newest one is "
        "skipped, and said so); a finished run is left as it is. `--resume` alone needs a "
        "checkpoint; `--resume auto` (for jobs that are requeued with the same command) also "
        "starts the run when --out holds none, or holds this config stopped before its first "
        "checkpoint",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run --out holds (deletes its config.json, metrics.jsonl, summary.json, "
        "checkpoints/ and tb/); without it such an --out is an error",
    )
    p.add_argument("--device", default=None, help="torch device (default: cuda:LOCAL_RANK if available, else cpu)")
    p.add_argument(
        "--elastic",
        action="store_true",
        help="under torchrun --nnodes MIN:MAX --max-restarts K (TorchElastic): the number of replicas "
        "is the launch's (WORLD_SIZE / ranks_per_worker), and every (re)start resumes from the "
        "newest checkpoint in --out, even one written with another number of replicas, or starts "
        "the run if there is none (see docs/guides/elastic.md)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="under torchrun: seconds to wait for a peer before stopping with an error that names "
        "the missing rank (default: 300)",
    )
    p.set_defaults(func=run)


def _under_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def _resume_mode(args: argparse.Namespace) -> dict[str, bool]:
    """``--resume`` must find a checkpoint; ``--resume auto`` resumes one or starts (the trainer's ``reuse``)."""
    if args.resume == "auto" and args.overwrite:
        raise ConfigError("--resume auto continues or starts the run in --out, --overwrite replaces it: choose one")
    return {"resume": args.resume == "yes", "reuse": args.resume == "auto", "overwrite": args.overwrite}


def run(args: argparse.Namespace) -> int:
    from diloco.train.trainer import Trainer

    preset = load_preset(args.preset)
    cfg = resolve(preset, args.method, overrides(args))
    name = Path(args.preset).stem
    out = args.out or Path("runs") / f"{name}-{args.method or cfg.method}"
    if args.elastic and not _under_torchrun():
        raise ConfigError(
            "--elastic needs a torchrun launch, e.g. `torchrun --nnodes 1:2 --max-restarts 3 "
            "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 -m diloco train --elastic ...`"
        )
    if args.device is not None:  # a device this process cannot use is refused before --out is touched
        from diloco.train.device import check_device

        check_device(args.device)
    if not _under_torchrun():
        trainer = Trainer(
            cfg, out, cache_dir=cache_dir(args), progress=not args.no_progress, device=args.device or "cpu"
        )
        print(json.dumps(trainer.run(**_resume_mode(args)).to_dict(), indent=2))
        return 0

    from diloco.distributed.launch import read_env, setup_communicators
    from diloco.distributed.watchdog import exit_when_orphaned

    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by a torchrun agent: a killed agent takes its worker along
        exit_when_orphaned(what="this node's torchrun agent")

    if args.elastic:  # M = this launch's number of workers
        from diloco.train.config import TrainConfig

        env = read_env()
        if env.world_size % cfg.ranks_per_worker:
            raise ConfigError(
                f"--elastic: {env.world_size} processes cannot form workers of ranks_per_worker="
                f"{cfg.ranks_per_worker} ranks; launch a multiple of {cfg.ranks_per_worker} processes "
                f"(--nproc-per-node {cfg.ranks_per_worker} per node) or set ranks_per_worker to a "
                f"divisor of {env.world_size}"
            )
        cfg = TrainConfig.from_dict({**cfg.to_dict(), "replicas": env.world_size // cfg.ranks_per_worker})
        if env.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
            print(
                "diloco: --elastic: a node joining this job will wait for the rendezvous until it times out "
                "(torch's shared rendezvous store); start the torchrun agents with "
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in their environment (docs/guides/elastic.md)",
                file=sys.stderr,
                flush=True,
            )

    # The world size is checked against replicas x ranks_per_worker before joining; workers x ranks layout;
    # timeouts; every communicator and the process group closed on the way out.
    if args.elastic and cfg.learner >= 0:
        raise ConfigError(
            f"--elastic resizes a job of several workers; a site job (learner={cfg.learner}) is one learner: "
            f"drop --elastic (torchrun --max-restarts restarts the site's job, which resumes from its checkpoint)"
        )
    with setup_communicators(
        replicas=1 if cfg.learner >= 0 else cfg.replicas,  # a decoupled site job runs one learner
        ranks_per_worker=cfg.ranks_per_worker,
        timeout_s=args.timeout,
        device=args.device,
        worker_sharding=cfg.worker_sharding,
        keys_per_attempt=not args.elastic,  # an elastic job's agents count their restarts apart
    ) as comms:
        trainer = Trainer(cfg, out, cache_dir=cache_dir(args), progress=not args.no_progress, device=str(comms.device))
        result = trainer.run_replica(
            comms.replica, **_resume_mode(args), intra=comms.intra, elastic=args.elastic, mesh=comms.mesh
        )
        if result is not None:
            print(json.dumps(result.to_dict(), indent=2))
    return 0
