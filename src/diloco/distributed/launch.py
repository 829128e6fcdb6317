"""Joining a torch.distributed job launched by torchrun: the one place that reads the environment.

``torchrun`` (single node ``--nproc-per-node N``, or multi-node with ``--nnodes``
and ``--rdzv-endpoint host:port``) starts one process per rank and tells each
who it is through environment variables; :func:`init_from_env` reads them and
initialises the default process group::

    env = init_from_env(timeout_s=600)          # gloo on CPU, nccl when CUDA is available
    comm = TorchDistCommunicator(timeout_s=300)  # the replica group = the whole world

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
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


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
            raise ValueError(
                f"environment variable {name} is not set: this process was not started by torchrun; "
                f"launch with e.g. `torchrun --nproc-per-node 2 -m diloco train ...`"
            )
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def read_env(environ: Mapping[str, str] | None = None) -> DistEnv:
    """Parse torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""
    environ = os.environ if environ is None else environ
    world_size = _int_var(environ, "WORLD_SIZE")
    rank = _int_var(environ, "RANK")
    local_rank = _int_var(environ, "LOCAL_RANK", 0)
    local_world_size = _int_var(environ, "LOCAL_WORLD_SIZE", 1)
    master_port = _int_var(environ, "MASTER_PORT")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"RANK={rank} must lie in 0..WORLD_SIZE-1 with WORLD_SIZE={world_size} >= 1")
    if not 0 <= local_rank < local_world_size:
        raise ValueError(f"LOCAL_RANK={local_rank} must lie in 0..LOCAL_WORLD_SIZE-1={local_world_size - 1}")
    return DistEnv(rank, world_size, local_rank, local_world_size, environ.get("MASTER_ADDR", "127.0.0.1"),
                   master_port)


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


def init_from_env(*, backend: str | None = None, timeout_s: float = 1800.0) -> DistEnv:
    """Initialise the default process group from torchrun's environment; return what it said.

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default nccl when CUDA is available, else gloo.
        timeout_s: the process group's timeout: the longest one collective may take in the backend
            (a fragment crossing a slow link must fit). :class:`~diloco.comm.torch_dist.TorchDistCommunicator`
            has its own, usually shorter, wait timeout.

    Uses the ``env://`` rendezvous, so under torchrun the ranks join the store its agent already
    hosts (``TORCHELASTIC_USE_AGENT_STORE``), which outlives any one rank: a survivor can still
    read there which peer stopped.
    """
    env = read_env()
    backend = backend or default_backend()
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if dist.is_initialized():
        raise ValueError("torch.distributed is already initialized; call init_from_env() once per process")
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank)
    else:
        bind_gloo_to_loopback_if_local(env.master_addr)
    dist.init_process_group(
        backend,
        init_method="env://",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    return env

