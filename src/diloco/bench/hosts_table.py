"""The measured table across emulated hosts beside the simulator's prediction: the pure parts of
``benchmarks/hosts_table.py`` (what a run's rows come to, what the simulator predicts for the same link,
bytes and step time, and the gap). No processes here; the driver runs them.

Per run (one method at one link rate across M hosts):

* **utilization** = compute seconds / wall seconds of the measured window's steps (the trainer's
  ``compute_time_s`` / ``step_time_s`` rows; a decoupled learner's ``compute_s`` / ``dt``, mean of the learners).
  The window skips the first round (``skip`` steps: start-up, the first syncs) and the last step (the final
  evaluation and checkpoint).
* **tokens/s** = tokens trained in the window / its wall seconds (synchronous: the global batch a step;
  decoupled: the sum of the learners' rates, each training its own share).
* **goodput** = useful tokens / the whole training span (every step, the first round, the evaluations, the
  stragglers' tail included). Useful: every step of a synchronous run without faults; for a decoupled run the
  steps whose work reached the syncer (:func:`diloco.decoupled.chaos_logs.kept_steps`).
* **sim**: :func:`diloco.sim.predict_utilization` at the run's link rate, its mean compute seconds a step, and
  the *measured* bytes: each worker's link carries what its communicator counted leaving it (the bits a parameter
  are set so that the simulator's exchange moves exactly those bytes each way, :func:`sim_bits`). Predicted tokens/s
  = predicted utilization x the tokens a step / the compute seconds a step. The simulator has no decoupled
  model: for that row the streaming model of the same H, P, tau and bytes stands in (``sim_model``).
* **gap**: measured - predicted utilization (points), and measured / predicted tokens/s - 1.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: The exchange the communicator runs among 3 or more replicas (``diloco.traffic.default_exchange``).
EXCHANGE_AT_3 = "reduce_scatter"


def _window(rows: Sequence[Mapping[str, Any]], *, skip: int, last: int, key: str = "loss") -> list[Mapping[str, Any]]:
    """Step rows (those with ``key``; evaluation rows have no ``loss``) with ``skip < step < last``, one a step."""
    got = {int(r["step"]): r for r in rows if key in r and skip < int(r["step"]) < last}
    if not got:
        raise ValueError(f"no step rows between step {skip} and {last}: run more steps (steps > sync_every + 1)")
    return [got[s] for s in sorted(got)]


def sync_window(rows: Sequence[Mapping[str, Any]], *, skip: int, last: int, tokens_per_step: float) -> dict[str, float]:
    """A synchronous run's window from the lead's metrics rows: utilization, tokens/s, compute seconds a step
    and bytes a worker sent a step (``bytes_sent`` is cumulative)."""
    w = _window(rows, skip=skip, last=last)
    compute = sum(float(r["compute_time_s"]) for r in w)
    wall = sum(float(r["step_time_s"]) for r in w)
    before = {int(r["step"]): r for r in rows if "loss" in r}.get(int(w[0]["step"]) - 1)
    sent = float(w[-1]["bytes_sent"]) - float(before["bytes_sent"] if before else 0.0)
    return {
        "steps": len(w),
        "utilization": compute / wall,
        "tokens_per_s": tokens_per_step * len(w) / wall,
        "compute_s_per_step": compute / len(w),
        "bytes_per_step": sent / len(w),
    }


def learner_window(
    rows_by_learner: Mapping[int, Sequence[Mapping[str, Any]]], *, skip: int, last: int, tokens_per_step: float
) -> dict[str, float]:
    """A decoupled run's window from each learner's step rows (``compute_s``, ``dt``) and metrics rows
    (``bytes_sent``, cumulative): utilization (mean of the learners), tokens/s (sum of the learners' rates;
    ``tokens_per_step`` is one learner's), compute seconds a step, bytes a learner sent a step and the share of
    its wall time a learner waited for replies (``wait_s``; means)."""
    utils, rates, computes, sent, waits = [], [], [], [], []
    for rows in rows_by_learner.values():
        w = _window(rows, skip=skip, last=last, key="dt")
        compute = sum(float(r["compute_s"]) for r in w)
        wall = sum(float(r["dt"]) for r in w)
        utils.append(compute / wall)
        waits.append(sum(float(r.get("wait_s", 0.0)) for r in w) / wall)
        rates.append(tokens_per_step * len(w) / wall)
        computes.append(compute / len(w))
        with_bytes = [r for r in w if "bytes_sent" in r]
        if len(with_bytes) >= 2:
            sent.append(
                (float(with_bytes[-1]["bytes_sent"]) - float(with_bytes[0]["bytes_sent"])) / (len(with_bytes) - 1)
            )
    n = len(utils)
    return {
        "steps": min(len(_window(r, skip=skip, last=last, key="dt")) for r in rows_by_learner.values()),
        "utilization": sum(utils) / n,
        "tokens_per_s": sum(rates),
        "compute_s_per_step": sum(computes) / n,
        "bytes_per_step": sum(sent) / len(sent) if sent else 0.0,
        "wait_share": sum(waits) / n,
    }


def sim_bits(*, bytes_per_step: float, sync_every: int, num_params: float, workers: int, exchange: str) -> float:
    """Bits a parameter such that the simulator's exchange moves the measured bytes: each round of ``sync_every``
    steps syncs every parameter once, and the simulator's link carries ``exchange_bytes`` of the payload."""
    from diloco.traffic import exchange_bytes

    per_payload_byte = exchange_bytes(payload_bytes=1.0, num_replicas=workers, exchange=exchange)
    return 8.0 * bytes_per_step * sync_every / (num_params * per_payload_byte)


def predict(
    *,
    method: str,
    mbps: float,
    compute_s_per_step: float,
    bytes_per_step: float,
    tokens_per_step: float,
    num_params: float,
    num_layers: int,
    non_block_params: float,
    workers: int,
    sync_every: int = 1,
    num_fragments: int = 1,
    overlap_steps: int = 0,
    exchange: str = EXCHANGE_AT_3,
) -> dict[str, Any]:
    """The simulator's utilization and tokens/s for one run (module docstring); ``tokens_per_step`` as the
    measured tokens/s counts them (all workers' tokens of one step)."""
    from diloco.sim import predict_utilization

    sim_method = "streaming" if method == "decoupled" else method
    if sim_method == "dp":
        sync_every, num_fragments, overlap_steps = 1, 1, 0
    bits = sim_bits(
        bytes_per_step=bytes_per_step, sync_every=sync_every, num_params=num_params, workers=workers, exchange=exchange
    )
    util = predict_utilization(
        method=sim_method,
        num_params=num_params,
        num_layers=num_layers,
        step_time_s=compute_s_per_step,
        bandwidth_bps=mbps * 1e6,
        sync_every=sync_every,
        num_fragments=num_fragments,
        overlap_steps=overlap_steps,
        bits=bits,
        num_workers=workers,
        non_block_params=non_block_params,
        overlap_backward=False,  # the trainer exchanges whole payloads after the step
        exchange=exchange,
    )
    return {
        "sim_model": sim_method if method != "decoupled" else "streaming (stand-in)",
        "sim_bits_per_param": bits,
        "sim_utilization": util,
        "sim_tokens_per_s": util * tokens_per_step / compute_s_per_step,
    }


def gaps(row: Mapping[str, Any]) -> dict[str, float | None]:
    """Measured against predicted: utilization in points (measured - sim), tokens/s as a ratio - 1."""
    u, su = row.get("utilization"), row.get("sim_utilization")
    t, st = row.get("tokens_per_s"), row.get("sim_tokens_per_s")
    return {
        "gap_utilization_points": None if u is None or su is None else 100.0 * (u - su),
        "gap_tokens_per_s": None if t is None or not st else t / st - 1.0,
    }


COLUMNS = [
    ("Mbit/s", "mbps", "g"),
    ("method", "method", ""),
    ("tokens/s", "tokens_per_s", ".0f"),
    ("sim tok/s", "sim_tokens_per_s", ".0f"),
    ("util", "utilization", ".1%"),
    ("sim util", "sim_utilization", ".1%"),
    ("gap pts", "gap_utilization_points", "+.1f"),
    ("gap tok/s", "gap_tokens_per_s", "+.1%"),
    ("goodput tok/s", "goodput_tokens_per_s", ".0f"),
    ("final loss", "final_eval_loss", ".4f"),
    ("MB/step", lambda r: r["bytes_per_step"] / 1e6, ".3f"),
    ("wall s", "wall_s", ".1f"),
]

__all__ = ["COLUMNS", "EXCHANGE_AT_3", "gaps", "learner_window", "predict", "sim_bits", "sync_window"]
