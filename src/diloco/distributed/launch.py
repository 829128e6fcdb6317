"""Joining a torch.distributed job launched by torchrun: the one place that reads the environment.

``torchrun`` (single node ``--nproc-per-node N``, or multi-node with ``--nnodes``
and ``--rdzv-endpoint host:port``) starts one process per rank and tells each
who it is through environment variables; :func:`init_from_env` reads them and
initialises the default process group::

    comms = setup_communicators(replicas=2, ranks_per_worker=1, timeout_s=300)
    algo = StreamingDiLoCo(model, comm=comms.replica, sync_every=30)   # comms.device, comms.intra

or, step by step, ``init_from_env(timeout_s=600)`` (gloo on CPU, nccl when CUDA is available) then
``TorchDistCommunicator(timeout_s=300)`` (the replica group = the whole world).

The rest of the library never reads the environment: it takes a process group
or a communicator as an argument.

Loopback by default: when the rendezvous address (``MASTER_ADDR``) is a loopback
address and ``GLOO_SOCKET_IFNAME`` is unset, gloo's data plane is bound to the
loopback interface too, so a single-node job never listens on an external
address. Multi-node jobs give a routable ``--rdzv-endpoint`` (and, if the host
has several interfaces, ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME``).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from diloco.errors import ConfigError
from diloco.methods import WORKER_SHARDING


@dataclass(frozen=True)
class DistEnv:
    """What torchrun tells one process about the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @property
    def node_rank(self) -> int:
        """Index of this process's node (workers are laid out node after node by torchrun)."""
        return self.rank // self.local_world_size


def _int_var(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None:
        if default is None:
            raise ConfigError(
                f"environment variable {name} is not set: this process was not started by torchrun; "
                f"launch with e.g. `torchrun --nproc-per-node 2 -m diloco train ...`"
            )
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def read_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Parse torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""
    environ = os.environ if environ is None else environ
    world_size = _int_var(environ, "WORLD_SIZE")
    rank = _int_var(environ, "RANK")
    local_rank = _int_var(environ, "LOCAL_RANK", 0)
    local_world_size = _int_var(environ, "LOCAL_WORLD_SIZE", 1)
    master_port = _int_var(environ, "MASTER_PORT")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"RANK={rank} must lie in 0..WORLD_SIZE-1 with WORLD_SIZE={world_size} >= 1")
    if not 0 <= local_rank < local_world_size:
        raise ConfigError(f"LOCAL_RANK={local_rank} must lie in 0..LOCAL_WORLD_SIZE-1={local_world_size - 1}")
    return DistEnv(rank, world_size, local_rank, local_world_size, environ.get("MASTER_ADDR", "127.0.0.1"), master_port)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and names that resolve only to them (e.g. ``localhost``)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def loopback_interface() -> str:
    """Name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    names = [name for _, name in socket.if_nameindex()]
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return next((n for n in names if n.startswith("lo")), "lo")


def bind_gloo_to_loopback_if_local(master_addr: str) -> None:
    """Keep gloo on the loopback interface when the rendezvous is local and the user chose nothing."""
    if is_loopback(master_addr) and "GLOO_SOCKET_IFNAME" not in os.environ:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


#: torchrun's per-rank variables: a process that starts a torchrun job keeps its own out of the job's environment.
RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def torchrun_command(*, nproc: int, args: Sequence[str], options: Sequence[str] = ()) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node NPROC [OPTIONS] -m diloco ARGS``: a torchrun
    job of ``nproc`` processes on this node (``options``: torchrun's own, e.g. ``--max-restarts``)."""
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    return [*head, *options, "-m", "diloco", *args]


def child_environment(**extra: str) -> dict[str, str]:
    """This process's environment without torchrun's per-rank variables (:data:`RANK_VARIABLES`), plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if k not in RANK_VARIABLES}, **extra}


def init_from_env(*, backend: str | None = None, timeout_s: float = 1800.0, keys_per_attempt: bool = True) -> DistEnv:
    """Initialise the default process group from torchrun's environment; return what it said.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default nccl when CUDA is available, else gloo.
        timeout_s: the process group's timeout: the longest one collective may take in the backend
            (a fragment crossing a slow link must fit). :class:`~diloco.comm.torch_dist.TorchDistCommunicator`
            has its own, usually shorter, wait timeout.
        keys_per_attempt: under torchrun, keep each restart's keys in the store apart (a prefix of the restart
            count), so a restarted rank never reads a dead predecessor's address. Every agent of a job must
            agree on the count: true for a job of fixed nodes, not for an elastic one a node may join
            (``--elastic``: False; there, start the agents with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), nor
            for a node whose torchrun is started again (a machine that was lost). Agents started with
            ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` give each round's workers a new store: no prefix is used.

    Uses the ``env://`` rendezvous, so under torchrun the ranks join the store its agent already
    hosts (``TORCHELASTIC_USE_AGENT_STORE``), which outlives any one rank: a survivor can still
    read there which peer stopped.
    """
    env = read_env()
    backend = backend or default_backend()
    if backend not in ("gloo", "nccl"):
        raise ConfigError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if dist.is_initialized():
        raise ConfigError("torch.distributed is already initialized; call init_from_env() once per process")
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank)
    else:
        bind_gloo_to_loopback_if_local(env.master_addr)
    timeout = timedelta(seconds=timeout_s)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    # Workers given a store of their round's own (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: rank 0's worker hosts a new
    # one each round) find no predecessor's keys there, and need no prefix; nor could they agree on one when one
    # node's torchrun was started again (its restart count starts from 0, the others' do not).
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "true").lower() != "false"
    if attempt is None or not keys_per_attempt or not agent_store:
        dist.init_process_group(
            backend, init_method="env://", rank=env.rank, world_size=env.world_size, timeout=timeout
        )
        return env
    # Under torchrun the store can outlive a restart of the workers (the agent's, shared with its rendezvous): the
    # keys each attempt's ranks publish (their gloo addresses) are kept apart by the restart count, so a restarted
    # rank never reads a dead predecessor's address (seen here: connection refused in about half the restarts).
    from torch.distributed.rendezvous import rendezvous

    store, rank, world_size = next(rendezvous("env://", env.rank, env.world_size, timeout=timeout))
    store = dist.PrefixStore(f"diloco/attempt-{attempt}", store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return env


@dataclass
class Communicators:
    """What one torchrun process needs to train: its replica communicator, its worker's group, its device.

    ``replica`` connects the M replicas (its ``rank`` is this process's replica, its ``world_size``
    M): pass it to :class:`~diloco.algorithm.streaming.StreamingDiLoCo` or
    :class:`~diloco.algorithm.data_parallel.DataParallel`. With workers of R > 1 ranks, ``intra``
    connects the R ranks of this worker, over which gradients are averaged every step
    (``DataParallel(model, comm=intra)``); it is ``None`` when R = 1. Use as a context manager, or
    call :meth:`close`, which also destroys the process group if :func:`setup_communicators` created it.
    """

    env: DistEnv
    replica: Any  # Communicator (TorchDistCommunicator, or WorkerCommunicator when R > 1)
    intra: Any | None
    device: torch.device
    num_replicas: int
    ranks_per_worker: int
    owns_process_group: bool = False
    #: ``worker_sharding="fsdp"``: the worker's 1-D DeviceMesh to ``fully_shard`` its model on (else None).
    #: ``replica`` then connects this rank's column (the same-index ranks of every worker, which hold the
    #: same shard) and ``intra`` the worker's R ranks (also when R = 1).
    mesh: Any = None

    @property
    def local_rank_in_worker(self) -> int:
        """This process's rank inside its worker (0 when R = 1)."""
        return 0 if self.intra is None else self.intra.rank

    @property
    def is_lead(self) -> bool:
        """True on the one process that logs and writes shared files: replica 0's first rank."""
        return self.replica.rank == 0 and self.local_rank_in_worker == 0

    def close(self, *, synchronize: bool = True) -> None:
        """Close every communicator opened (their heartbeats) and the process group if it was ours.

        With ``synchronize`` (a clean exit), the ranks first meet in a barrier bounded by the
        communicator's timeout, so no rank tears its connections down while a peer still finishes its
        last transfer over them (a peer can then abort in gloo's threads at exit). After a failure
        (``synchronize=False``, what the context manager passes on an exception) nobody waits.
        """
        if self.mesh is not None:
            opened = [self.replica, self.intra]
        elif self.intra is not None:
            opened = [self.replica.cross, self.replica.intra]
        else:
            opened = [self.replica]
        if synchronize and self.owns_process_group and dist.is_initialized() and dist.get_world_size() > 1:
            try:
                dist.barrier(async_op=True).wait(timeout=timedelta(seconds=opened[0].timeout_s))
            except Exception:
                pass
        for comm in opened:
            comm.close()
        if self.owns_process_group and dist.is_initialized():
            dist.destroy_process_group()

    def __enter__(self) -> Communicators:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(synchronize=exc_type is None)


def check_world_size(world_size: int, replicas: Any, ranks_per_worker: Any) -> None:
    """Raise a ValueError that says what to launch when ``world_size`` != replicas x ranks_per_worker."""
    for name, value in (("replicas", replicas), ("ranks_per_worker", ranks_per_worker)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name}={value!r}: need an integer >= 1")
    if world_size != replicas * ranks_per_worker:
        hint = ""
        if world_size % ranks_per_worker == 0:
            hint = f", or set replicas={world_size // ranks_per_worker} for this launch"
        raise ConfigError(
            f"{world_size} processes were launched but replicas x ranks_per_worker = {replicas} x "
            f"{ranks_per_worker} = {replicas * ranks_per_worker}; launch "
            f"{replicas * ranks_per_worker} processes (torchrun --nproc-per-node ...){hint}"
        )


def setup_communicators(
    *,
    replicas: int | None = None,
    ranks_per_worker: int = 1,
    timeout_s: float = 300.0,
    backend: str | None = None,
    process_group_timeout_s: float | None = None,
    device: str | torch.device | None = None,
    worker_sharding: str = "replicate",
    keys_per_attempt: bool = True,
) -> Communicators:
    """Join a torchrun job and build its communicators: the one call a training script needs.

    Args:
        replicas: M, the number of DiLoCo replicas (workers); default: the world size / ``ranks_per_worker``.
        ranks_per_worker: R, data-parallel processes per replica (consecutive global ranks, so
            ``--nproc-per-node R`` puts one worker on each node).
        timeout_s: how long a communicator waits for a peer before raising an error naming the
            missing rank.
        backend: ``"gloo"`` or ``"nccl"`` (default: nccl when CUDA is available, else gloo).
        process_group_timeout_s: the process group's own timeout (one collective in the backend);
            default ``max(1800, 2 * timeout_s)``.
        device: this process's device (default: ``cuda:LOCAL_RANK`` when CUDA is available, else CPU).
        worker_sharding: ``"replicate"`` (each rank of a worker a full copy) or ``"fsdp"`` (the worker's model
            to be ``fully_shard``'ed over its R ranks on ``Communicators.mesh``; ``replica`` is then this
            rank's column across workers, see :meth:`~diloco.comm.mesh.Layout.shard_communicator`).
        keys_per_attempt: as :func:`init_from_env`'s (False for an elastic job that nodes may join).

    The world size is checked against M x R from torchrun's environment *before* any process group
    is created, so a wrong launch fails at once with a message saying what to launch. If the
    default process group already exists it is used as it is (and not destroyed by ``close``)::

        with setup_communicators(replicas=2) as comms:
            algo = StreamingDiLoCo(model, comm=comms.replica, sync_every=30)
    """
    env = read_env()
    R = ranks_per_worker
    if isinstance(R, bool) or not isinstance(R, int) or R < 1:
        raise ConfigError(f"ranks_per_worker={R!r}: need an integer >= 1")
    if worker_sharding not in WORKER_SHARDING:
        raise ConfigError(f"worker_sharding={worker_sharding!r}: choose one of {', '.join(WORKER_SHARDING)}")
    M = replicas if replicas is not None else env.world_size // R
    check_world_size(env.world_size, M, R)
    if not timeout_s > 0:
        raise ConfigError(f"timeout_s={timeout_s!r}: need a positive number of seconds, e.g. 300")
    owns = not dist.is_initialized()
    if owns:
        pg_timeout = process_group_timeout_s if process_group_timeout_s is not None else max(1800.0, 2 * timeout_s)
        init_from_env(backend=backend, timeout_s=pg_timeout, keys_per_attempt=keys_per_attempt)
    elif dist.get_world_size() != env.world_size:
        raise ConfigError(
            f"torch.distributed is initialized with {dist.get_world_size()} ranks but "
            f"WORLD_SIZE={env.world_size}; initialise it from torchrun's environment or not at all"
        )
    if device is None:
        device = f"cuda:{env.local_rank}" if torch.cuda.is_available() else "cpu"
    try:
        from diloco.comm.torch_dist import TorchDistCommunicator

        mesh = None
        if worker_sharding == "fsdp":
            from diloco.comm.mesh import build_layout

            layout = build_layout(M, R)
            replica = layout.shard_communicator(timeout_s=timeout_s)
            intra = TorchDistCommunicator(layout.intra_group, timeout_s=timeout_s)
            mesh = layout.device_mesh["local"]
        elif R == 1:
            replica, intra = TorchDistCommunicator(timeout_s=timeout_s), None
        else:
            from diloco.comm.mesh import build_layout

            replica = build_layout(M, R).communicator(timeout_s=timeout_s)
            intra = replica.intra
    except BaseException:
        if owns and dist.is_initialized():
            dist.destroy_process_group()
        raise
    return Communicators(env, replica, intra, torch.device(device), M, R, owns, mesh)
