"""A training replica's state in and out of its run's checkpoints: save, commit, load, restore.

The files are :mod:`diloco.train.checkpoint`'s (one ``torch.save`` file per replica) or,
for FSDP workers, :mod:`diloco.train.sharded_checkpoint`'s (every rank its shards); this
module is the trainer's side of them, for one :class:`~diloco.train.replica.Replica`:

* :func:`save` writes the replica's state of a step (a worker's replicated ranks hold one
  state: its first rank writes it; sharded workers: every rank its shards, in the
  background with ``checkpoint_async``), and :func:`commit` makes the step the latest
  once every process's files are written (after a barrier, replica 0 records it; where
  machines have folders of their own, each folder's lead records its own workers' files,
  :mod:`diloco.train.run_folders`).
* :func:`restore` reads the replica's state back; :func:`restore_resized` does so for a
  checkpoint written by another number of workers (an elastic restart) or, sharded,
  of ranks per worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from diloco.train import checkpoint as ckpt
from diloco.train import sharded_checkpoint
from diloco.train.config import TrainConfig
from diloco.train.replica import Replica, Run
from diloco.train.run_folders import Folder


def run_record(cfg: TrainConfig, run: Run) -> dict[str, Any]:
    """What a checkpoint's record says of its run (besides its step and files): the config, the number of
    replicas, the wall time so far, the threads, the data's digest, the vocabulary size."""
    return {
        "config": cfg.to_dict(),
        "num_replicas": cfg.job_replicas,
        "wall_time_s": run.wall_time(),
        "threads": run.threads,
        "data_sha256": run.data_sha256,
        "vocab_size": run.vocab_size,
    }


def replica_state(rep: Replica) -> dict[str, Any]:
    """What a replica's checkpoint file holds: its model, inner optimizer, algorithm, sampler and counters."""
    return {
        "model": rep.model.state_dict(),
        "optimizer": rep.opt.state_dict(),
        "algorithm": rep.algo.state_dict(),
        "sampler": rep.sampler.state_dict(),
        "dropped": rep.dropped,
        "train_time_s": rep.train_time,
    }


def save(
    rep: Replica,
    step: int,
    *,
    run_dir: Path,
    record: dict[str, Any],
    keep: int,
    last: bool,
    extra: Callable[[], Sequence[str]] | None = None,
    folder: Folder | None = None,
) -> None:
    """Every replica writes its file (sharded workers: every rank its shards); after a barrier replica 0
    makes ``step`` the latest (:func:`commit`), keeping the last ``keep`` steps. ``extra`` (replica 0, after
    the barrier): writes more files into the step's folder and names them, for the record. ``folder``: this
    process's ``run_dir`` as the job found it (torchrun; None: one folder every replica shares).

    A background write (sharded, ``checkpoint_async``) that is not the ``last`` step's is committed after the
    next step instead (its writes overlap that step): it waits in ``rep.writing`` until then.
    """
    state = replica_state(rep) if rep.sharded or rep.local == 0 else None
    record = dict(record)
    writing = None
    if rep.sharded:
        record["format"] = sharded_checkpoint.FORMAT
        writing = sharded_checkpoint.save_worker(
            run_dir,
            step,
            worker=rep.rank,
            rank=rep.local,
            state=state,
            model=rep.model,
            opt=rep.opt,
            algo=rep.algo,
            process_group=rep.mesh.get_group(),
            async_group=rep.async_group,
        )
    elif state is not None:  # a worker's replicated ranks hold one state: its first rank writes it
        ckpt.save_replica(run_dir, step, rep.rank, state)
    if writing is not None and not last:
        assert extra is None, "a background checkpoint with files of the method's own is not built"
        rep.writing = (step, writing, record)  # committed after the next step (the writes overlap it)
    else:
        commit(rep, step, writing, record, run_dir=run_dir, keep=keep, extra=extra, folder=folder)


def commit(
    rep: Replica,
    step: int,
    writing: Any,
    record: dict[str, Any],
    *,
    run_dir: Path,
    keep: int,
    extra: Callable[[], Sequence[str]] | None = None,
    folder: Folder | None = None,
) -> None:
    """Once every rank's files of ``step`` are written (a background write: its Future, ``writing``), replica 0
    writes the ``extra`` files (the method's own state, e.g. the decoupled syncer's), records the step with them
    and makes it the latest, keeping the last ``keep`` steps.

    Folders of the machines' own (``folder`` not shared): each folder's lead records its workers' files, and only
    after a second barrier (every folder has recorded ``step``) does any delete its older steps."""
    if writing is not None:
        writing.result()
    rep.writing = None
    rep.barrier()  # every replica's file is on disk before the step becomes "latest"
    if folder is None or folder.shared:
        if rep.evaluates:
            ckpt.commit(run_dir, step, record, keep=keep, extra=extra() if extra is not None else ())
        return
    if folder.lead:
        names = extra() if extra is not None and rep.evaluates else ()
        ckpt.commit(run_dir, step, record, keep=keep, extra=names, replicas=folder.workers, prune=False)
    rep.barrier()  # every folder has recorded the step: the older ones can go
    if folder.lead:
        ckpt.prune_steps(run_dir, step, keep=keep)


def load(rep: Replica, step: int, *, run_dir: Path, worker: int, rank: int = 0) -> dict[str, Any]:
    """Worker ``worker``'s saved state of ``step`` (sharded workers: onto this rank's shards, with rank
    ``rank``'s non-tensor state)."""
    if not rep.sharded:
        return ckpt.load_replica(run_dir, worker, step)
    return sharded_checkpoint.load_worker(
        run_dir,
        step,
        worker=worker,
        rank=rank,
        model=rep.model,
        opt=rep.opt,
        algo=rep.algo,
        process_group=rep.mesh.get_group(),
    )


def restore(rep: Replica, step: int, *, run_dir: Path) -> None:
    """The replica's own state of ``step``, saved by the same number of workers and ranks."""
    mine = load(rep, step, run_dir=run_dir, worker=rep.rank, rank=rep.local)
    rep.model.load_state_dict(mine["model"])
    rep.opt.load_state_dict(mine["optimizer"])
    rep.algo.load_state_dict(mine["algorithm"])
    rep.sampler.load_state_dict(mine["sampler"])
    rep.dropped, rep.train_time = int(mine["dropped"]), float(mine["train_time_s"])


def restore_resized(rep: Replica, step: int, *, run_dir: Path, saved_replicas: int, replicas: int) -> None:
    """Resume a checkpoint of ``saved_replicas`` workers with ``replicas`` (an elastic restart), or of
    sharded workers of ``rep.saved_ranks`` ranks with the run's ranks per worker (DCP reshards every tensor).

    Global parameters and outer-optimizer state are the same in every file: each worker takes
    them from its own. Worker r < saved_replicas keeps file r's local parameters and inner
    optimizer; a worker beyond them starts from the global parameters with a copy of worker 0's
    inner optimizer (AdamW moments and step count). In-flight exchanges are dropped on every
    worker (their contributions were encoded for the old peers): each such fragment's next sync
    starts from the saved global copy. The sampler re-cuts the rest of the epoch
    (:meth:`~diloco.data.ShardSampler.recut_from`).
    """
    own = rep.rank < saved_replicas
    rank = rep.local if rep.local < rep.saved_ranks else 0  # whose counters and sampler position
    saved = load(rep, step, run_dir=run_dir, worker=rep.rank if own else 0, rank=rank)
    algo_state = dict(saved["algorithm"])
    if algo_state.get("pending"):
        started = {int(p): int(e["started_at"]) for p, e in algo_state["pending"].items()}
        algo_state["dropped_in_flight"] = {**algo_state.get("dropped_in_flight", {}), **started}
        algo_state["pending"] = {}
    rep.model.load_state_dict(saved["model"])
    rep.opt.load_state_dict(saved["optimizer"])
    rep.algo.load_state_dict(algo_state)
    if not own:
        rep.model.load_state_dict(rep.algo.global_state_dict())
    if saved_replicas != replicas:
        rep.sampler.recut_from(saved["sampler"])
    else:  # only the ranks per worker changed: the workers read on as they were
        rep.sampler.load_state_dict(saved["sampler"])
    rep.dropped, rep.train_time = int(saved["dropped"]), float(saved["train_time_s"])


__all__ = ["commit", "load", "replica_state", "restore", "restore_resized", "run_record", "save"]
