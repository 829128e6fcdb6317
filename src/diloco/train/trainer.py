"""The trainer: data-parallel, DiLoCo and Streaming DiLoCo on one model, data set and token budget.

M replicas run as M threads of this process through the in-process
communicator (see :mod:`diloco.comm.local`), each executing :func:`_replica_loop`,
the same per-replica code a torch.distributed worker runs. The global batch is
split B/M per replica, so every method sees the same number of tokens.

Under torchrun a replica may be a *worker* of R = ``ranks_per_worker`` processes
(:meth:`Trainer.run_replica` with ``intra``): each rank computes the gradient of
its 1/R slice of the replica's batch, the R gradients are averaged inside the
worker every step, and the algorithm runs across workers. A worker thus trains
on exactly the batches the in-process replica would, and its R ranks hold one
state, checkpointed once (by local rank 0) in the same format.

Outputs in ``out_dir``: ``config.json`` (resolved), ``metrics.jsonl`` (one row
per step, eval rows too), ``summary.json`` and ``checkpoints/`` (see
:mod:`diloco.train.checkpoint`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from diloco.algorithm.data_parallel import DataParallel
from diloco.algorithm.streaming import StreamingDiLoCo
from diloco.comm.base import CommError, Communicator
from diloco.comm.local import run_replicas
from diloco.train import checkpoint as ckpt
from diloco.train.config import TrainConfig
from diloco.train.metrics import JSONLSink, MetricLogger, MultiLogger, TensorBoardSink, read_jsonl


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to inner_lr, then cosine decay to min_lr_ratio * inner_lr at the last step."""
    total = cfg.total_steps
    if cfg.warmup_steps > 0 and step <= cfg.warmup_steps:
        return cfg.inner_lr * step / cfg.warmup_steps
    span = max(1, total - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.min_lr_ratio
    return cfg.inner_lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


@dataclass
class RunResult:
    out_dir: Path
    final_eval_loss: float
    steps: int
    tokens: int
    bytes_sent_per_replica: int
    bytes_received_per_replica: int
    peak_bytes_per_sync: int
    peak_bytes_in_flight: int
    wall_time_s: float
    train_time_s: float
    num_params: int
    dropped_contributions: int

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["out_dir"] = str(self.out_dir)
        return d


class _StepTable:
    """Collects each replica's per-step record; logs one merged row once all M have reported."""

    def __init__(self, num_replicas: int, logger: MetricLogger, on_row: Callable[[dict], None]) -> None:
        self.m = num_replicas
        self.logger = logger
        self.on_row = on_row
        self._rows: dict[int, list[dict]] = {}
        self._lock = threading.Lock()

    def add(self, rank: int, step: int, record: dict[str, Any]) -> None:
        with self._lock:
            parts = self._rows.setdefault(step, [])
            parts.append(record | {"rank": rank})
            if len(parts) < self.m:
                return
            del self._rows[step]
            row = merge_step_records(parts)
            self.logger.log(row)
            self.on_row(row)


def merge_step_records(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One row per step: mean loss over replicas, global tokens, replica 0's byte counters."""
    parts = sorted(parts, key=lambda r: r["rank"])
    first = parts[0]
    row = {k: v for k, v in first.items() if k not in ("rank", "loss", "step_time_s", "compute_time_s", "tokens")}
    row["loss"] = sum(p["loss"] for p in parts) / len(parts)
    row["tokens"] = sum(p["tokens"] for p in parts)
    row["step_time_s"] = max(p["step_time_s"] for p in parts)
    row["compute_time_s"] = max(p["compute_time_s"] for p in parts)
    row["tokens_per_s"] = row["tokens"] / row["step_time_s"] if row["step_time_s"] > 0 else None
    return row


def build_model(cfg: TrainConfig, vocab_size: int) -> torch.nn.Module:
    from diloco.models import Transformer, make_config

    torch.manual_seed(cfg.seed)
    mc = make_config(cfg.size, vocab_size=vocab_size, seq_len=cfg.seq_len, z_loss=cfg.z_loss)
    return Transformer(mc)


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: list[tuple[torch.Tensor, torch.Tensor]], bf16: bool = False) -> float:
    """Mean cross-entropy (no z-loss) over fixed validation batches."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    device = next(model.parameters()).device
    for x, y in batches:
        x, y = x.to(device), y.to(device)
        with _autocast(bf16, device):
            logits, _ = model(x)
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    return total / count


def _autocast(enabled: bool, device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16) if enabled else contextlib.nullcontext()


class Trainer:
    """Runs one configured training job; see the module docstring."""

    def __init__(
        self,
        cfg: TrainConfig,
        out_dir: Path,
        *,
        cache_dir: Path,
        progress: bool = True,
        device: str = "cpu",
        stop_after: int | None = None,
    ) -> None:
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.cache_dir = Path(cache_dir)
        self.progress = progress
        self.device = torch.device(device)
        self.stop_after = stop_after  # simulate a crash after this many steps (tests)

    # -- setup ---------------------------------------------------------------
    def _prepare(self, resume: bool, comm: Communicator | None = None, lead: bool = True) -> dict[str, Any] | None:
        """Data, validation batches, and (with ``resume``) the checkpoint's metadata.

        Under torch.distributed (``comm`` given, a barrier over every process) the ``lead`` process
        builds the tokenizer and token cache first and the others then read it, instead of all of
        them racing to build it.
        """
        from diloco.data import eval_batches, prepare_tokens

        cfg = self.cfg
        if comm is not None and not lead:
            comm.barrier()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.data = prepare_tokens(cfg.sources, cfg.vocab_size, self.cache_dir, val_fraction=cfg.val_fraction)
        if comm is not None and lead:
            comm.barrier()
        self.val = list(eval_batches(self.data.val, batch_size=cfg.global_batch, seq_len=cfg.seq_len,
                                     max_batches=cfg.eval_batches))
        meta = None
        if resume:
            meta = ckpt.latest_meta(self.out_dir)
            saved = TrainConfig.from_dict(meta["config"])
            if saved.with_overrides({"steps": cfg.steps, "tokens": cfg.tokens}) != cfg:
                raise ValueError(f"--resume: the checkpoint in {self.out_dir} was written by a different config; "
                                 f"resume with the same settings (see {self.out_dir}/config.json)")
        if lead:
            (self.out_dir / "config.json").write_text(json.dumps(self.cfg.to_dict(), indent=2) + "\n")
        # Built once and seeded (threads share torch's global RNG); replica 0's copy is broadcast anyway.
        self._template = build_model(cfg, self.data.tokenizer.vocab_size)
        self._wall_before = float(meta["wall_time_s"]) if meta else 0.0
        self._t0 = time.perf_counter()
        return meta

    def _logger(self, start_step: int, resume: bool) -> MultiLogger:
        sinks: list[MetricLogger] = [JSONLSink(self.out_dir / "metrics.jsonl",
                                               truncate_after_step=start_step if resume else None)]
        if self.cfg.tensorboard:
            sinks.append(TensorBoardSink(self.out_dir / "tb"))
        return MultiLogger(*sinks)

    def run(self, *, resume: bool = False) -> RunResult:
        """M replicas as M threads of this process (the in-process communicator)."""
        cfg = self.cfg
        if cfg.ranks_per_worker != 1:
            raise ValueError(f"ranks_per_worker={cfg.ranks_per_worker} needs one process per rank: launch "
                             f"{cfg.replicas * cfg.ranks_per_worker} processes with torchrun, "
                             f"or set ranks_per_worker=1")
        meta = self._prepare(resume)
        start_step = int(meta["step"]) if meta else 0
        logger = self._logger(start_step, resume)
        bar = _progress_bar(self.progress, cfg.total_steps, start_step, cfg.method)
        table = _StepTable(cfg.replicas, logger, lambda row: _update_bar(bar, row))
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // cfg.replicas))
        try:
            results = run_replicas(partial(self._replica_loop, table=table, logger=logger,
                                           start_step=start_step), cfg.replicas)
        finally:
            logger.close()
            if bar is not None:
                bar.close()
        return self._finish(results[0])

    def run_replica(self, comm: Communicator, *, resume: bool = False,
                    intra: Communicator | None = None) -> RunResult | None:
        """This process is one replica of ``comm``'s group (torchrun). Replica 0 logs and returns the result.

        With ``cfg.ranks_per_worker`` = R > 1, ``comm`` connects the workers (rank = worker index, e.g.
        :class:`~diloco.comm.mesh.WorkerCommunicator`, whose ``barrier`` spans every process) and
        ``intra`` the R ranks of this worker, over which gradients are averaged every step.
        Logged losses are those of replica 0's first rank (no extra collective per step to average them).
        """
        cfg = self.cfg
        R = cfg.ranks_per_worker
        if comm.world_size != cfg.replicas:
            raise ValueError(f"config replicas={cfg.replicas} but {comm.world_size} replicas were launched; "
                             f"pass --set replicas={comm.world_size} or launch {cfg.replicas * R} processes")
        if (1 if intra is None else intra.world_size) != R:
            raise ValueError(f"config ranks_per_worker={R} but this worker has "
                             f"{1 if intra is None else intra.world_size} ranks; launch replicas x ranks_per_worker "
                             f"= {cfg.replicas * R} processes")
        lead = comm.rank == 0 and (intra is None or intra.rank == 0)
        meta = self._prepare(resume, comm, lead)
        start_step = int(meta["step"]) if meta else 0
        logger = self._logger(start_step, resume) if lead else MultiLogger()
        bar = _progress_bar(self.progress and lead, cfg.total_steps, start_step, cfg.method)
        table = _StepTable(1, logger, lambda row: _update_bar(bar, row))
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        try:
            out = self._replica_loop(comm, table=table, logger=logger, start_step=start_step, intra=intra)
        finally:
            logger.close()
            if bar is not None:
                bar.close()
        return self._finish(out) if lead else None

    def _finish(self, rank0: dict[str, Any]) -> RunResult:
        cfg = self.cfg
        result = RunResult(
            out_dir=self.out_dir,
            final_eval_loss=rank0["final_eval_loss"],
            steps=cfg.total_steps,
            tokens=cfg.total_steps * cfg.tokens_per_step,
            bytes_sent_per_replica=rank0["stats"]["bytes_sent"],
            bytes_received_per_replica=rank0["stats"]["bytes_received"],
            peak_bytes_per_sync=rank0["stats"]["peak_exchange"],
            peak_bytes_in_flight=rank0["stats"]["peak_in_flight"],
            wall_time_s=time.perf_counter() - self._t0 + self._wall_before,
            train_time_s=rank0["train_time_s"],
            num_params=rank0["num_params"],
            dropped_contributions=rank0["dropped"],
        )
        (self.out_dir / "summary.json").write_text(json.dumps(result.to_dict(), indent=2) + "\n")
        return result

    # -- one replica ---------------------------------------------------------
    def _replica_loop(self, comm: Communicator, *, table: _StepTable, logger: MetricLogger,
                      start_step: int, intra: Communicator | None = None) -> dict[str, Any]:
        from diloco.data import ShardSampler

        cfg, rank, dev = self.cfg, comm.rank, self.device
        local = 0 if intra is None else intra.rank  # this process's rank inside its worker
        evaluates = rank == 0 and local == 0
        model = copy.deepcopy(self._template).to(dev)
        eval_model = copy.deepcopy(model) if evaluates else None
        opt = torch.optim.AdamW(model.parameters(), lr=cfg.inner_lr, betas=(cfg.beta1, cfg.beta2),
                                weight_decay=cfg.weight_decay)
        algo: DataParallel | StreamingDiLoCo
        if cfg.method == "dp":
            algo = DataParallel(model, comm=comm, codec=cfg.dp_codec)
        else:
            algo = StreamingDiLoCo(
                model, opt, comm=comm, sync_every=cfg.sync_every, num_fragments=cfg.num_fragments,
                fragment_pattern=cfg.fragment_pattern, overlap_steps=cfg.overlap_steps,
                merge_alpha=cfg.merge_alpha, codec=cfg.codec,
                outer_optimizer=partial(torch.optim.SGD, lr=cfg.outer_lr, momentum=cfg.outer_momentum,
                                        nesterov=cfg.outer_nesterov and cfg.outer_momentum > 0),
            )
        # Inside a worker of R ranks: gradients averaged every step (fp32, exact up to the summation order).
        in_worker = DataParallel(model, comm=intra, codec="fp32") if intra is not None else None
        # The replica's sampler on every rank of the worker; rank `local` computes `rows` of each batch.
        sampler = ShardSampler(self.data.train, rank=rank, world_size=cfg.replicas,
                               batch_size=cfg.batch_per_replica, seq_len=cfg.seq_len, seed=cfg.seed)
        rows = slice(local * cfg.batch_per_rank, (local + 1) * cfg.batch_per_rank)
        dropped, train_time = 0, 0.0
        if start_step > 0:
            mine = ckpt.load_replica(self.out_dir, rank, start_step)
            model.load_state_dict(mine["model"])
            opt.load_state_dict(mine["optimizer"])
            algo.load_state_dict(mine["algorithm"])
            sampler.load_state_dict(mine["sampler"])
            dropped, train_time = int(mine["dropped"]), float(mine["train_time_s"])
        params = [p for p in model.parameters() if p.requires_grad]
        num_params = sum(p.numel() for p in params)
        final_eval = float("nan")
        step = start_step
        try:
            for step in range(start_step + 1, self.cfg.total_steps + 1):
                if self.stop_after is not None and step > self.stop_after:
                    raise _SimulatedCrash(f"stopped after step {self.stop_after}")
                t_start = time.perf_counter()
                lr = lr_at(step, cfg)
                for group in opt.param_groups:
                    group["lr"] = lr
                x, y = sampler.next_batch()
                tokens = x.numel()  # the replica's
                x, y = x[rows].to(dev, non_blocking=True), y[rows].to(dev, non_blocking=True)
                with _autocast(cfg.bf16, dev):
                    _, loss = model(x, y)
                loss.backward()
                compute = time.perf_counter() - t_start
                if in_worker is not None:  # communication, not compute: outside `compute`
                    dropped += len(in_worker.sync_gradients().dropped_replicas)
                if isinstance(algo, DataParallel):
                    report = algo.sync_gradients()
                    dropped += len(report.dropped_replicas)
                t1 = time.perf_counter()
                grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip) if cfg.grad_clip > 0 else None
                opt.step()
                opt.zero_grad(set_to_none=True)
                compute += time.perf_counter() - t1
                reports = algo.step()
                last = step == cfg.total_steps
                if last and isinstance(algo, StreamingDiLoCo):
                    reports += algo.flush()
                dropped += sum(len(r.dropped_replicas) for r in reports)
                step_time = time.perf_counter() - t_start
                train_time += step_time
                stats = comm.stats
                table.add(rank, step, {
                    "step": step, "loss": loss.item(), "lr": lr, "tokens": tokens,
                    "grad_norm": None if grad_norm is None else float(grad_norm),
                    "bytes_sent": stats.bytes_sent, "bytes_received": stats.bytes_received,
                    "peak_in_flight": stats.peak_in_flight, "peak_bytes_per_sync": stats.peak_exchange,
                    "synced_fragments": [r.fragment for r in reports], "dropped": dropped,
                    "step_time_s": step_time, "compute_time_s": compute,
                })
                if evaluates and (step % cfg.eval_every == 0 or last):
                    eval_model.load_state_dict(algo.global_state_dict())
                    final_eval = evaluate(eval_model, self.val, cfg.bf16)
                    logger.log({"step": step, "eval_loss": final_eval, "tokens_seen": step * cfg.tokens_per_step})
                if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or last:
                    if local == 0:  # a worker's ranks hold one state: its first rank writes it
                        ckpt.save_replica(self.out_dir, step, rank, {
                            "model": model.state_dict(), "optimizer": opt.state_dict(),
                            "algorithm": algo.state_dict(), "sampler": sampler.state_dict(), "dropped": dropped,
                            "train_time_s": train_time,
                        })
                    comm.barrier()  # every replica's file is on disk before the step becomes "latest"
                    if evaluates:
                        ckpt.commit(self.out_dir, step, {
                            "config": cfg.to_dict(), "num_replicas": cfg.replicas,
                            "wall_time_s": time.perf_counter() - self._t0 + self._wall_before})
        except CommError as exc:
            where = f"replica {rank}" if intra is None else f"replica {rank} (rank {local} of its {intra.world_size})"
            raise CommError(f"{where} at step {step}: {exc}") from exc
        return {"final_eval_loss": final_eval, "stats": comm.stats.totals(), "train_time_s": train_time,
                "num_params": num_params, "dropped": dropped}


class _SimulatedCrash(RuntimeError):
    pass


def _progress_bar(enabled: bool, total: int, initial: int, desc: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="step", dynamic_ncols=True, leave=True)


def _update_bar(bar, row: dict) -> None:
    if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{row['loss']:.3f}", tok_s=f"{row['tokens_per_s'] or 0:.0f}", refresh=False)


def train(cfg: TrainConfig, out_dir: Path, *, cache_dir: Path, resume: bool = False,
          progress: bool = True, device: str = "cpu") -> RunResult:
    """Train one configuration; see :class:`Trainer`."""
    return Trainer(cfg, out_dir, cache_dir=cache_dir, progress=progress, device=device).run(resume=resume)


def load_metrics(out_dir: Path) -> list[dict[str, Any]]:
    return read_jsonl(Path(out_dir) / "metrics.jsonl")
