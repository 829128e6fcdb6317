"""Where a sweep's runs execute: in this process, in local processes, or on a SLURM cluster.

An executor takes a run function and a list of run configs and yields ``(config, result, error)``
as each run finishes, in whatever order they finish. The sweep (:func:`diloco.scaling.sweep.run_sweep`)
is the only writer of the results file: it appends each record as it arrives, under a lock, so a
run is written once however its executor ran it, and an interrupted sweep resumes from the file.

* :class:`InlineExecutor` — every run in this process, one after another (fast; for tests and the
  synthetic runner).
* :class:`LocalExecutor` — every run in a fresh process of its own (``spawn``; one process per
  run), ``workers`` at a time. A crash of one run (even a segfault) is that run's failure only. An
  interrupted sweep (Ctrl-C, or SIGTERM to the sweep alone) stops its runs in progress before it exits.
* :class:`SubmititExecutor` — every run a job of ``submitit``: SLURM (``cluster="slurm"``), or
  submitit's own local executor (``cluster="local"``, each job its own process; what the tests use).
  Jobs that are still queued or running when the sweep is interrupted are cancelled.

The run function must be importable by name in the child (a module-level function), since it is
sent to another process.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError

RunFn = Callable[[dict[str, Any]], dict[str, Any]]
Outcome = tuple[dict[str, Any], Any, "str | None"]  # (config, result, error message)

EXECUTORS = ("inline", "local", "submitit-local", "slurm")


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def run_in_child(fn: RunFn, config: dict[str, Any]) -> dict[str, Any]:
    """What a child process runs: the run function, with where it ran and how long it took added."""
    t0 = time.perf_counter()
    result = fn(config)
    if isinstance(result, dict):
        result = {
            "wall_time_s": round(time.perf_counter() - t0, 3),
            **result,
            "worker": {"pid": os.getpid(), "host": socket.gethostname()},
        }
    return result


def stop_workers(processes: set, *, grace_s: float = 10.0) -> None:
    """Terminate the run processes of an interrupted sweep (SIGTERM, then SIGKILL after ``grace_s``). A run
    killed this way resumes from its last checkpoint when the sweep is run again."""
    for p in processes:
        p.terminate()
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


class InlineExecutor:
    """Runs every config in this process, in order."""

    name = "inline"

    def run(self, fn: RunFn, configs: Sequence[dict[str, Any]]) -> Iterator[Outcome]:
        for cfg in configs:
            t0 = time.perf_counter()
            try:
                result = fn(dict(cfg))
                if isinstance(result, dict):
                    result = {"wall_time_s": round(time.perf_counter() - t0, 3), **result}
                yield cfg, result, None
            except Exception as exc:  # a failed run is data; KeyboardInterrupt still stops the sweep
                yield cfg, None, _error(exc)


class LocalExecutor:
    """Each config in a fresh process of its own, ``workers`` at a time."""

    name = "local"

    def __init__(self, workers: int = 1) -> None:
        if not (isinstance(workers, int) and workers >= 1):
            raise ConfigError(f"workers={workers!r}: give a whole number of processes >= 1")
        self.workers = workers

    def run(self, fn: RunFn, configs: Sequence[dict[str, Any]]) -> Iterator[Outcome]:
        if not configs:
            return
        ctx = multiprocessing.get_context("spawn")  # a clean interpreter per run (no inherited torch threads)
        before = set(multiprocessing.active_children())
        pool: cf.ProcessPoolExecutor | None = None
        futures: dict[cf.Future, dict[str, Any]] = {}
        completed = False
        try:  # (an interrupt while the runs are handed out, a run's process already started, is cleaned up too)
            pool = cf.ProcessPoolExecutor(
                max_workers=min(self.workers, len(configs)), mp_context=ctx, max_tasks_per_child=1
            )
            for cfg in configs:
                futures[pool.submit(run_in_child, fn, dict(cfg))] = cfg
            for fut in cf.as_completed(futures):
                cfg = futures[fut]
                try:
                    yield cfg, fut.result(), None
                except cf.process.BrokenProcessPool as exc:
                    yield cfg, None, f"the run's process died ({exc})"
                except Exception as exc:
                    yield cfg, None, _error(exc)
            completed = True
        finally:
            for fut in futures:
                fut.cancel()
            if not completed:  # interrupted (Ctrl-C, SIGTERM, an error): stop the runs in progress, or they
                stop_workers(set(multiprocessing.active_children()) - before)  # train on, orphaned, unrecorded
            if pool is not None:  # (left running, the pool would hold the process' exit until its runs ended)
                pool.shutdown(wait=True, cancel_futures=True)


class SubmititExecutor:
    """Each config a submitit job: on SLURM, or on submitit's local executor (each job its own process)."""

    def __init__(
        self,
        folder: Path | str,
        *,
        cluster: str = "slurm",
        poll_s: float = 0.2,
        parameters: dict[str, Any] | None = None,
    ) -> None:
        if cluster not in ("slurm", "local", "debug"):
            raise ConfigError(f"cluster={cluster!r}: choose slurm, local or debug")
        try:
            import submitit  # noqa: F401
        except ImportError:
            raise ConfigError("the submitit executors need submitit: pip install submitit") from None
        self.folder, self.cluster, self.poll_s = Path(folder), cluster, poll_s
        self.parameters = dict(parameters or {})
        self.name = "slurm" if cluster == "slurm" else f"submitit-{cluster}"

    def _executor(self) -> Any:
        import submitit

        ex = submitit.AutoExecutor(folder=str(self.folder / "%j"), cluster=self.cluster)
        if self.parameters:
            ex.update_parameters(**self.parameters)
        return ex

    def run(self, fn: RunFn, configs: Sequence[dict[str, Any]]) -> Iterator[Outcome]:
        if not configs:
            return
        ex = self._executor()
        jobs = [(ex.submit(run_in_child, fn, dict(cfg)), cfg) for cfg in configs]
        pending = list(jobs)
        try:
            while pending:
                still = []
                for job, cfg in pending:
                    if not job.done():
                        still.append((job, cfg))
                        continue
                    try:
                        yield cfg, job.result(), None
                    except Exception as exc:  # submitit re-raises the job's error (or its death) here
                        text = str(exc).strip().splitlines()
                        yield cfg, None, f"{type(exc).__name__}: {text[-1] if text else exc}"
                pending = still
                if pending:
                    time.sleep(self.poll_s)
        finally:
            for job, _ in pending:
                try:
                    job.cancel(check=False)
                except Exception:  # best effort: the job may have just finished
                    traceback.print_exc()


def make_executor(
    name: str, *, workers: int = 1, folder: Path | str | None = None, parameters: dict[str, Any] | None = None
) -> Any:
    """An executor by name: inline, local (``workers`` processes), submitit-local or slurm (``folder``)."""
    if name == "inline":
        return InlineExecutor()
    if name == "local":
        return LocalExecutor(workers)
    if name in ("submitit-local", "slurm"):
        if folder is None:
            raise ConfigError(f"the {name} executor needs a folder for its job files (--submitit-dir)")
        return SubmititExecutor(folder, cluster="local" if name == "submitit-local" else "slurm", parameters=parameters)
    raise ConfigError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")


__all__ = ["EXECUTORS", "InlineExecutor", "LocalExecutor", "SubmititExecutor", "make_executor", "run_in_child"]
