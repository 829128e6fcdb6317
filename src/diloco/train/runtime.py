"""The seam between the trainer and a method that runs parts of its own beside the replicas.

The trainer (:mod:`diloco.train.trainer`) runs every method's replicas through one loop. The synchronous
methods need nothing else: their replicas talk through the run's communicator. A method whose replicas
talk to a service of their own (Decoupled DiLoCo's learners and their syncer) plugs in here, as a
:class:`MethodRuntime`, and the trainer drives it through that small interface only:

* :meth:`MethodRuntime.config_errors`: what the method cannot run with (the config collects them);
* :meth:`MethodRuntime.check_reachable`: the services the run needs answer, before any file is written;
* :meth:`MethodRuntime.check_launch`: the launch suits the method (threads, torchrun ranks, sharding);
* :meth:`MethodRuntime.session`: the method's service for the run's ``with`` block, a :class:`Session` that
  builds each replica's algorithm, keeps each replica's own log, and gives the run's final parameters; it is
  opened at the run's ``start_step`` (> 0: a resume, its own state read back from that step's checkpoint).

Checkpoints: at a checkpoint step every replica calls :meth:`Session.prepare_checkpoint` before its state is
saved (decoupled: the learner applies every reply in flight), and once every replica's file is written the lead
calls :meth:`Session.save`, which writes the service's own state into the step's folder (decoupled: the syncer's);
the step's record then covers those files too (their SHA-256, keep-K, the fallback to the step before).

Which runtime a method has is :data:`PLUGINS`: a method's name and the module that provides its runtime,
loaded when a run of that method starts (the way an entry point is). The trainer never imports a method's
package: :mod:`diloco.decoupled` depends on :mod:`diloco.train`, not the other way round (a test checks
that no two packages import each other).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from diloco.algorithm.base import ReplicaAlgorithm, SyncReport

#: method -> the module whose ``RUNTIME`` is its :class:`MethodRuntime` (methods not named: :class:`MethodRuntime`).
PLUGINS: dict[str, str] = {"decoupled": "diloco.decoupled.runtime"}


class ReplicaLog:
    """A replica's own rows (e.g. ``learner-<m>.jsonl``), written by its lead rank after every step."""

    def start(self, algo: ReplicaAlgorithm, step: int) -> None:
        """Before the replica's first step of this run: its algorithm is built (a decoupled learner has joined),
        its checkpoint of step ``step`` (0: none) restored."""

    def add(self, algo: ReplicaAlgorithm, step: int, out: Any) -> None:
        """After step ``step`` (``out``: its :class:`~diloco.train.inner_step.StepOutcome`)."""

    def close(self) -> None:
        """At the end of the replica's loop, whatever ended it."""


class Session:
    """A method's running service for one run (opened by :meth:`MethodRuntime.session`)."""

    def algorithm(
        self, cfg: Any, model: torch.nn.Module, comm: Any, *, learner: int, fragments: list[list[str]] | None
    ) -> ReplicaAlgorithm:
        """Replica ``learner``'s algorithm (its number in the run; ``comm``: this job's replicas), connected to the
        service."""
        raise NotImplementedError

    def replica_log(self, out_dir: Path, replica: int, *, append: bool) -> ReplicaLog | None:
        """Replica ``replica``'s own log (its lead rank's), or None."""
        return None

    def abort(self, reason: str) -> None:
        """The run stops (a replica diverged): replicas waiting on the service stop too."""

    def prepare_checkpoint(self, algo: ReplicaAlgorithm) -> list[SyncReport]:
        """At a checkpoint step, on every rank, before the replica's state is saved: what must be finished first
        (its reports). A run without interruption does the same at that step, so a resumed run follows it."""
        return []

    def save(self, run_dir: Path, step: int) -> list[str]:
        """On the lead, once every replica's file of ``step`` is written and before the step is recorded: write
        the service's own state into the step's folder (:func:`diloco.train.checkpoint.step_dir`); the names of
        the files written there (the step's record lists them with their digests)."""
        return []

    def final_parameters(self) -> dict[str, torch.Tensor] | None:
        """Once the session has ended: the run's final global parameters (evaluated for the run's final loss)
        where they live outside the replicas, else None (on processes that do not hold them, too)."""
        return None

    def learner_times(self, mine: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Under torchrun: every replica's ``train_time_s`` and ``waited_s`` (a collective of every process; ``mine``
        this process's loop result), on the lead process; None elsewhere or where not kept."""
        return None

    def result_fields(self, learners: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Fields of the run's summary from the replicas' loop results (each one's ``train_time_s`` and
        ``waited_s``): e.g. goodput and each replica's share of time spent waiting."""
        return {}


class MethodRuntime:
    """A method's runtime; this base is the synchronous methods' (nothing beside the replicas)."""

    def config_errors(self, cfg: Any) -> list[str]:
        """What the method cannot run with (each message names the value and the fix)."""
        return []

    def check_reachable(self, cfg: Any) -> None:
        """The services the run needs answer (a ConfigError naming the address and the fix otherwise)."""

    def check_launch(self, cfg: Any, *, torchrun: bool, sharded: bool) -> None:
        """The launch suits the method: ``torchrun`` (one process per rank) or threads, ``sharded`` workers."""

    def check_inputs(self, cfg: Any, *, template: torch.nn.Module, fragments: list[list[str]] | None) -> None:
        """The run's model (built, before the run directory is touched) suits the method's service, e.g. its host's
        memory (a ConfigError naming what it needs and the fix otherwise)."""

    @contextlib.contextmanager
    def session(
        self,
        cfg: Any,
        *,
        template: torch.nn.Module,
        fragments: list[list[str]] | None,
        out_dir: Path,
        data: Any = None,
        comm: Any = None,
        intra: Any = None,
        start_step: int = 0,
    ) -> Iterator[Session | None]:
        """The method's service for the ``with`` block: threads (``comm`` None) or this process of a torchrun job
        (``comm``: the workers', ``intra``: this worker's ranks); ``data``: the run's
        :class:`~diloco.data.TokenData` (a service may check it). ``start_step`` > 0: the run resumes from that
        step's checkpoint in ``out_dir`` (the service's state is read back from it, before any replica joins).
        None: the method has none."""
        yield None


_LOADED: dict[str, MethodRuntime] = {}


def runtime_for(method: str) -> MethodRuntime:
    """The runtime of ``method`` (:data:`PLUGINS`), loaded once."""
    if method not in _LOADED:
        module = PLUGINS.get(method)
        _LOADED[method] = importlib.import_module(module).RUNTIME if module else MethodRuntime()
    return _LOADED[method]


__all__ = ["PLUGINS", "MethodRuntime", "ReplicaLog", "Session", "runtime_for"]
