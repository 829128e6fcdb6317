"""Decoupled DiLoCo in the trainer: its :class:`~diloco.train.runtime.MethodRuntime` (the trainer's plug-in).

The trainer runs the learners as its replicas, with its one loop; this runtime adds the syncer beside them
(:func:`~diloco.decoupled.trainer.decoupled_syncer` on a thread or a Ray actor; under torchrun,
:func:`~diloco.decoupled.torchrun.torchrun_syncer`), builds each learner's
:class:`~diloco.decoupled.learner.Learner` on a channel to it, keeps each learner's rows
(``learner-<m>.jsonl``), writes ``merges.jsonl`` at the end and hands the trainer the syncer's final global
parameters (the run's final loss is theirs) with the learners' goodput and waiting shares.

Checkpoints: at a checkpoint step each learner applies every reply in flight (:meth:`Learner.flush
<diloco.decoupled.learner.Learner.flush>`; a run without interruption does so too) before the trainer saves its
state; once every learner's file is written the lead saves the syncer's state as ``syncer.pt`` in the step's
folder (:data:`SYNCER_FILE`; ``syncer-<s>.pt`` per shard with ``syncer_shards`` > 1: :func:`syncer_files`;
listed in the step's record). A resumed run rebuilds the syncer from that file
before any learner joins; each learner then joins again and restores its own state
(:meth:`~diloco.decoupled.learner.Learner.load_state_dict`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from diloco.decoupled.trainer import (
    LearnerLog,
    decoupled_learner,
    decoupled_syncer,
    learner_goodput,
    learner_wait_shares,
    write_merges,
)
from diloco.errors import ConfigError
from diloco.files import atomic_write_with
from diloco.train import checkpoint as ckpt
from diloco.train.runtime import MethodRuntime, ReplicaLog, Session

#: The syncer's state in a step's checkpoint folder (one syncer; shard s of several: ``syncer-<s>.pt``).
SYNCER_FILE = "syncer.pt"


def syncer_files(num_shards: int) -> list[str]:
    """The files of a step's folder that hold the syncer's state, one per shard (:data:`SYNCER_FILE` for one)."""
    return [SYNCER_FILE] if num_shards == 1 else [f"syncer-{s}.pt" for s in range(num_shards)]


def load_syncer_state(out_dir: Path, step: int, *, name: str = SYNCER_FILE) -> dict[str, Any]:
    """The syncer's state (file ``name``) saved with checkpoint ``step`` of the run in ``out_dir``
    (``weights_only=True``)."""
    path = ckpt.step_dir(out_dir, step) / name
    if not path.is_file():
        raise ckpt.CheckpointError(
            f"checkpoint {ckpt.step_dir(out_dir, step)} holds no syncer state ({path.name} missing): this decoupled "
            f"run cannot resume from it (a run resumes with the syncer_shards it was written with); start afresh "
            f"with --overwrite or train into another --out"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ckpt.CheckpointError(
            f"the syncer state {path} does not load ({type(exc).__name__}); delete {ckpt.step_dir(out_dir, step)} "
            f"and its record to resume from the checkpoint before it, or start afresh with --overwrite"
        ) from None


def load_syncer_states(out_dir: Path, step: int, num_shards: int) -> list[dict[str, Any]]:
    """The state of each of the ``num_shards`` syncer shards saved with checkpoint ``step``, in shard order."""
    return [load_syncer_state(out_dir, step, name=name) for name in syncer_files(num_shards)]


class _Learners(Session):
    """The learners' side of a running syncer (``running``: a :class:`~diloco.decoupled.trainer.RunningSyncer`)."""

    def __init__(self, running: Any, *, torchrun: bool = False, lead: bool = True, start_step: int = 0) -> None:
        self.running, self.torchrun, self.lead, self.start_step = running, torchrun, lead, start_step
        self.final: dict[str, Any] = {}

    def algorithm(
        self, cfg: Any, model: torch.nn.Module, comm: Any, *, learner: int, fragments: list[list[str]] | None
    ) -> Any:
        return decoupled_learner(
            cfg, model, self.running.channel(learner), learner=learner, fragments=fragments, stats=comm.stats
        )

    def replica_log(self, out_dir: Path, replica: int, *, append: bool) -> ReplicaLog:
        return LearnerLog(out_dir, replica, append=append)

    def abort(self, reason: str) -> None:
        self.running.abort(reason)

    def prepare_checkpoint(self, algo: Any) -> list[Any]:
        return algo.settle()  # every reply in flight applied: nothing of the learner's lives only in the syncer

    def save(self, run_dir: Path, step: int) -> list[str]:
        # after the commit's barrier: every learner has flushed, no report is in flight
        assert self.running.states is not None, "this transport cannot read the syncer's state"
        states = self.running.states()
        names = syncer_files(len(states))
        for name, state in zip(names, states, strict=True):
            atomic_write_with(ckpt.step_dir(run_dir, step) / name, lambda f, state=state: torch.save(state, f))
        return names

    def final_parameters(self) -> dict[str, torch.Tensor] | None:
        return self.final.get("global")

    def learner_times(self, mine: dict[str, Any]) -> list[dict[str, Any]] | None:
        import torch.distributed as dist

        times: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(
            times, {k: mine[k] for k in ("train_time_s", "waited_s", "steps")} if self.lead else None
        )
        return [t for t in times if t is not None]

    def result_fields(self, learners: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return {
            "goodput": learner_goodput(learners),
            "wait_share": learner_wait_shares(learners),
            "learner_steps": [int(r["steps"]) for r in learners],
        }


class _SiteLearner(_Learners):
    """A site job's learner: the syncer is a service of its own that checkpoints itself, so a checkpoint of the
    site holds the learner alone (and a resume takes the service's current fragments on joining again)."""

    def save(self, run_dir: Path, step: int) -> list[str]:
        return []


class _Site:
    """A site job's link to a running ``diloco syncer`` (``cfg.syncer`` = NAME@HOST:PORT): its lead rank holds the
    gRPC channel (:mod:`diloco.decoupled.rpc.client`; no Ray at the site); under torchrun with R ranks the others share what the lead receives
    (:class:`~diloco.decoupled.torchrun.GroupChannel`)."""

    def __init__(self, cfg: Any, *, data: Any = None, intra: Any = None) -> None:
        self.cfg, self.data, self.intra = cfg, data, intra
        self.lead = intra is None or intra.rank == 0

    def channel(self, m: int) -> Any:
        link = None
        if self.lead:  # claims learner m at the syncer, its config and data checked against the syncer's
            from diloco.decoupled.service import connect_learner

            link = connect_learner(
                self.cfg,
                learner=m,
                syncer=self.cfg.syncer,
                vocab_size=None if self.data is None else self.data.vocab_size,
                data_digest=None if self.data is None else self.data.digest(),
            )
        if self.intra is None or self.intra.world_size == 1:
            return link
        from diloco.decoupled.torchrun import GroupChannel

        return GroupChannel(link, group=self.intra.group, lead=self.intra.global_ranks[0])

    def abort(self, reason: str) -> None:
        """A site job's learner stops alone: the syncer and the other sites go on."""


class DecoupledRuntime(MethodRuntime):
    """``method='decoupled'``: a syncer beside the learners (module docstring)."""

    def config_errors(self, cfg: Any) -> list[str]:
        from diloco.decoupled.config_checks import decoupled_errors

        return decoupled_errors(cfg)

    def check_launch(self, cfg: Any, *, torchrun: bool, sharded: bool) -> None:
        if torchrun and cfg.learner_budget == "tokens" and not (cfg.syncer and cfg.ranks_per_worker == 1):
            raise ConfigError(
                "learner_budget=tokens is built for learners on threads of one process (decoupled_transport threads "
                "or ray) or for site jobs of one rank (syncer=NAME@HOST:PORT), not for one learner per torchrun "
                "process of one job: launch without torchrun, or set learner_budget=steps"
            )

    def check_inputs(self, cfg: Any, *, template: torch.nn.Module, fragments: list[list[str]] | None) -> None:
        if not cfg.syncer:  # the syncer runs here (a site job's runs at the service, which checks its own host)
            from diloco.decoupled.capacity import check_syncer_memory
            from diloco.decoupled.syncer_device import resolve_syncer_device

            resolve_syncer_device(cfg.syncer_device)  # syncer_device=cuda on a host without a GPU: refused here
            on_cluster = cfg.decoupled_transport == "ray" and bool(cfg.ray_address)
            check_syncer_memory(cfg, template, fragments, on_cluster=on_cluster)

    def check_reachable(self, cfg: Any) -> None:
        address = cfg.ray_address if cfg.decoupled_transport == "ray" else ""
        if cfg.syncer:
            from diloco.decoupled.service import RAY_SCHEME, parse_syncer

            address = parse_syncer(cfg.syncer)[1]
            if not address.startswith(RAY_SCHEME):  # a site job: the service's gRPC endpoint answers (no Ray here)
                from diloco.decoupled.rpc.probe import check_syncer

                check_syncer(cfg.syncer, num_shards=cfg.syncer_shards)
                return
            address = address.removeprefix(RAY_SCHEME)  # a learner of diloco chaos, inside the syncer's cluster
        if address:
            try:
                from diloco.decoupled.ray_transport import check_address
            except ImportError:
                raise ConfigError(
                    "method='decoupled' with a Ray syncer needs Ray: pip install -e .[ray] (or ray>=2.9)"
                ) from None
            check_address(address)

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
    ) -> Iterator[Session]:
        if cfg.syncer:  # a site job: one learner joining a running syncer, which keeps the merges and the result
            site = _Site(cfg, data=data, intra=intra)
            yield _SiteLearner(
                site, torchrun=comm is not None, lead=intra is None or intra.rank == 0, start_step=start_step
            )
            return
        if comm is None:  # threads: the syncer on a thread of this process, or a Ray actor
            states = load_syncer_states(out_dir, start_step, cfg.syncer_shards) if start_step > 0 else None
            with decoupled_syncer(cfg, template, fragments, states=states) as running:
                learners = _Learners(running, start_step=start_step)
                yield learners
                write_merges(Path(out_dir) / "merges.jsonl", running.records())
                learners.final["global"] = running.global_parameters()
            return
        from diloco.decoupled.torchrun import torchrun_syncer

        lead = intra is None or intra.rank == 0
        first = start_step > 0 and comm.rank == 0 and lead
        states = load_syncer_states(out_dir, start_step, cfg.syncer_shards) if first else None
        with torchrun_syncer(cfg, template, fragments, worker=comm.rank, intra=intra, states=states) as (
            running,
            final,
        ):
            learners = _Learners(running, torchrun=True, lead=lead, start_step=start_step)
            yield learners
        if "records" in final:  # worker 0's lead, once every process has finished
            write_merges(Path(out_dir) / "merges.jsonl", final["records"])
            learners.final["global"] = final["global"]


#: What :func:`diloco.train.runtime.runtime_for` loads for ``method='decoupled'``.
RUNTIME = DecoupledRuntime()

__all__ = ["RUNTIME", "SYNCER_FILE", "DecoupledRuntime", "load_syncer_state", "load_syncer_states", "syncer_files"]
