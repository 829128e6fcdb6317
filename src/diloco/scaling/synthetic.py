"""A synthetic "trainer": a known noisy scaling law, so sweeps, fits and reports can be tested and
demonstrated in milliseconds. Its records say ``"synthetic": true``; they are not measurements.

The loss of a run is

    L = A * N^alpha * M^beta * (1 + dp_penalty [DP only])
        * (1 + k_lr * ln(lr / lr*)^2 + k_batch * ln(B / B*)^2 + k_outer * ln(eta / eta*)^2 [DiLoCo])
        * exp(noise * eps),   eps ~ N(0, 1) seeded by the run's config,

a power law in N and M with a quadratic bowl in the log of each hyperparameter, whose optima
follow power laws too: lr* = A_lr N^alpha_lr M^beta_lr and B* = A_B N^alpha_B M^beta_B. The default
coefficients are the paper's (arXiv 2503.09799, Tables 8-10), so synthetic curves look like its
figures. H is ignored.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class SyntheticLaw:
    loss_A: float = 19.226
    loss_alpha: float = -0.0985
    loss_beta: float = 0.0116
    dp_penalty: float = 0.003  # DP is a little worse than DiLoCo M=1, as in the paper's Table 4
    lr_A: float = 22256.0
    lr_alpha: float = -0.8827
    lr_beta: float = 0.2929
    batch_A: float = 0.00709
    batch_alpha: float = 0.4695
    batch_beta: float = 0.3399
    k_lr: float = 0.02
    k_batch: float = 0.01
    k_outer: float = 0.01
    noise: float = 0.001  # relative (log-space) standard deviation of the loss

    def best_loss(self, num_params: Any, replicas: Any = 1, method: str = "diloco") -> np.ndarray:
        """The noiseless loss at the optimal hyperparameters."""
        base = self.loss_A * np.power(num_params, self.loss_alpha) * np.power(replicas, self.loss_beta)
        return base * (1.0 + self.dp_penalty) if method == "dp" else base

    def optimal_inner_lr(self, num_params: Any, replicas: Any = 1) -> np.ndarray:
        return self.lr_A * np.power(num_params, self.lr_alpha) * np.power(replicas, self.lr_beta)

    def optimal_global_batch(self, num_params: Any, replicas: Any = 1) -> np.ndarray:
        return self.batch_A * np.power(num_params, self.batch_alpha) * np.power(replicas, self.batch_beta)

    @staticmethod
    def optimal_outer_lr(replicas: float) -> float:
        """The paper's optimal outer lr per M (0.4, 0.6, 0.6, 0.8 for M = 1, 2, 4, 8), log-interpolated."""
        return float(np.interp(math.log2(replicas), [0, 1, 2, 3], [0.4, 0.6, 0.6, 0.8]))

    def loss(
        self,
        *,
        num_params: float,
        replicas: int,
        method: str,
        inner_lr: float,
        global_batch: float,
        outer_lr: float | None,
        rng: np.random.Generator | None = None,
    ) -> float:
        m = 1 if method == "dp" else replicas
        bowl = (
            self.k_lr * math.log(inner_lr / float(self.optimal_inner_lr(num_params, m))) ** 2
            + self.k_batch * math.log(global_batch / float(self.optimal_global_batch(num_params, m))) ** 2
        )
        if method != "dp" and outer_lr is not None:
            bowl += self.k_outer * math.log(outer_lr / self.optimal_outer_lr(m)) ** 2
        eps = 0.0 if rng is None else float(rng.standard_normal())
        return float(self.best_loss(num_params, m, method)) * (1.0 + bowl) * math.exp(self.noise * eps)


DEFAULT_LAW = SyntheticLaw()


def _seed_of(config: dict[str, Any]) -> int:
    payload = json.dumps(config, sort_keys=True, default=str).encode()
    return int.from_bytes(hashlib.sha256(payload).digest()[:8], "little")


def synthetic_run(config: dict[str, Any], law: SyntheticLaw = DEFAULT_LAW) -> dict[str, Any]:
    """Run function for :func:`diloco.scaling.sweep.run_sweep`: the loss of ``law`` at this config.

    The noise is seeded by the config itself, so a rerun of a grid point gives the same record.
    """
    rng = np.random.default_rng(_seed_of(config))
    loss = law.loss(
        num_params=config["num_params"],
        replicas=config["replicas"],
        method=config["method"],
        inner_lr=config["inner_lr"],
        global_batch=config["global_batch"],
        outer_lr=config.get("outer_lr"),
        rng=rng,
    )
    return {"eval_loss": loss, "synthetic": True}
