"""The data-parallel baseline: gradients averaged across replicas every step.

Goes through the same communicator, codec and byte accounting as DiLoCo, so
that the two are compared on the same footing::

    dp = DataParallel(model, comm=comm)
    for x, y in batches:
        loss = model(x, y)[1]; loss.backward()
        dp.sync_gradients()          # every replica now holds the mean gradient (= before_optimizer_step())
        opt.step(); opt.zero_grad()

A replica whose gradient is non-finite is dropped from that step's average
(as DiLoCo drops a non-finite outer gradient); every replica drops the same
one, so they stay identical.
"""

from __future__ import annotations

import torch
from torch import nn

from diloco.algorithm.base import ReplicaAlgorithm, SyncReport, broadcast_parameters
from diloco.algorithm.fragments import flatten
from diloco.comm.base import Communicator
from diloco.errors import ConfigError
from diloco.wire.codec import Codec
from diloco.wire.registry import get_codec


class DataParallel(ReplicaAlgorithm):
    """One replica of synchronous data-parallel training (the baseline of the papers)."""

    def __init__(self, model: nn.Module, *, comm: Communicator, codec: str | Codec = "fp32") -> None:
        self.model = model
        self.comm = comm
        self.codec = get_codec(codec)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ConfigError("the model has no trainable parameters (requires_grad=True)")
        broadcast_parameters(model, comm)
        self.step_count = 0

    def before_optimizer_step(self) -> list[SyncReport]:
        """The gradient average (:meth:`sync_gradients`) is what data parallelism does before the step."""
        return [self.sync_gradients()]

    @torch.no_grad()
    def sync_gradients(self) -> SyncReport:
        """Replace every parameter's gradient by the mean over replicas (call between backward and step)."""
        self.step_count += 1
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = flatten(grads)
        work = self.comm.mean_async(
            self.comm.encode(flat, self.codec), codec=self.codec, numel=flat.numel(), tag="gradients"
        )
        mean, dropped = work.wait()
        report = SyncReport(
            self.step_count, 0, self.step_count, flat.numel(), work.link_bytes.sent, work.link_bytes.received, dropped
        )
        if mean is None:  # every replica diverged: no update this step
            report.skipped = True
            mean = torch.zeros_like(flat)
        offset = 0
        for p in self.params:
            n = p.numel()
            g = mean[offset : offset + n].view(p.shape).to(p.dtype)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
            offset += n
        return report

    def global_state_dict(self) -> dict[str, torch.Tensor]:
        """For data parallelism the local parameters are the global ones."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def state_dict(self) -> dict:
        return {"step": self.step_count, "comm_stats": self.comm.stats.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.step_count = int(state["step"])
        self.comm.stats.load_state_dict(state["comm_stats"])
