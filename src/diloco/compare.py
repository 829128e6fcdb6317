"""Run several methods on one preset and compare quality against bytes exchanged."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diloco.errors import ConfigError
from diloco.files import atomic_write_bytes, read_jsonl, write_json
from diloco.train.config import TrainConfig
from diloco.train.result import RunResult
from diloco.train.trainer import Trainer


def run_compare(
    configs: dict[str, TrainConfig],
    out_dir: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    device: str = "cpu",
    reuse: bool = True,
) -> list[dict[str, Any]]:
    """Train each named config into ``out_dir/<name>``.

    Every method's settings and run directory are checked before any trains: a finished run
    with the same config is reused (unless ``reuse`` is False), an interrupted one is resumed,
    and a directory holding a run of another config is an error naming the keys that differ.
    ``reuse=False`` retrains every method, replacing its run directory.
    """
    trainers = {
        name: Trainer(cfg, Path(out_dir) / name, cache_dir=cache_dir, progress=progress, device=device)
        for name, cfg in configs.items()
    }
    plans, errors = {}, []
    for name, trainer in trainers.items():
        try:
            plans[name] = trainer.plan(reuse=reuse, overwrite=not reuse, replace_flag="--fresh")
        except ValueError as exc:
            errors.append(f"{name}: {exc}")
    if errors:
        raise ConfigError("nothing was trained:\n" + "\n".join(errors))
    rows = []
    for name, trainer in trainers.items():
        plan = plans[name]
        if plan.action == "finished":
            result = RunResult.from_dict(plan.summary).to_dict()
            result["reused"] = True
        else:
            if progress:
                print(f"== {name}: {describe(trainer.cfg)}", flush=True)
            result = trainer.run(reuse=reuse, overwrite=not reuse).to_dict()
            result["reused"] = False
        rows.append({"name": name, "config": trainer.cfg.to_dict(), **result})
    add_relative_columns(rows)
    write_outputs(rows, Path(out_dir))
    return rows


def describe(cfg: TrainConfig) -> str:
    if cfg.method == "dp":
        return f"data-parallel, M={cfg.replicas}"
    s = f"{cfg.method}, M={cfg.replicas}, H={cfg.sync_every}, outer lr {cfg.outer_lr}"
    if cfg.method == "streaming":
        s += (
            f", P={cfg.num_fragments} {cfg.fragment_pattern}, tau={cfg.overlap_steps}, "
            f"alpha={cfg.merge_alpha}, {cfg.codec}"
        )
    return s


def add_relative_columns(rows: list[dict[str, Any]]) -> None:
    """% eval loss vs data-parallel and how many times fewer bytes than it (when a dp run is present)."""
    dp = next((r for r in rows if r["config"]["method"] == "dp"), None)
    for r in rows:
        if dp is None:
            r["loss_vs_dp_pct"] = r["bytes_fewer_than_dp"] = None
            continue
        losses = (r["final_eval_loss"], dp["final_eval_loss"])
        r["loss_vs_dp_pct"] = None if None in losses else 100.0 * (losses[0] / losses[1] - 1.0)
        sent = r["bytes_sent_per_replica"]
        r["bytes_fewer_than_dp"] = (dp["bytes_sent_per_replica"] / sent) if sent else None


def human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} PB"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    header = ["method", "eval loss", "vs DP", "sent/replica", "x fewer", "peak/sync", "wall"]
    lines = []
    for r in rows:
        pct = r.get("loss_vs_dp_pct")
        fewer = r.get("bytes_fewer_than_dp")
        lines.append(
            [
                r["name"],
                "-" if r["final_eval_loss"] is None else f"{r['final_eval_loss']:.4f}",
                "-" if pct is None else f"{pct:+.2f}%",
                human_bytes(r["bytes_sent_per_replica"]),
                "-" if fewer is None else (f"{fewer:.0f}x" if fewer >= 10 else f"{fewer:.2f}x"),
                human_bytes(r["peak_bytes_per_sync"]),
                f"{r['wall_time_s']:.0f}s",
            ]
        )
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    out += [fmt.format(*line) for line in lines]
    return "\n".join(out)


def format_report(rows: Sequence[dict[str, Any]]) -> str:
    """The table, and under it how to read its gaps (:func:`diloco.scaling.paper_gap.reading_note`)."""
    from diloco.scaling.paper_gap import reading_note

    note = reading_note(rows) if any(r["config"]["method"] == "dp" for r in rows) else ""
    return format_table(rows) + ("\n\n" + textwrap.fill(note, width=100) if note else "")


def write_outputs(rows: list[dict[str, Any]], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "compare.json", rows)
    atomic_write_bytes(out_dir / "compare.txt", (format_report(rows) + "\n").encode("utf-8"))
    plot_compare(rows, out_dir)


def plot_compare(rows: Sequence[dict[str, Any]], out_dir: Path) -> None:
    """eval loss vs tokens for every method, and final eval loss vs bytes sent (log x)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        evals = [m for m in read_jsonl(Path(r["out_dir"]) / "metrics.jsonl") if "eval_loss" in m]
        ax.plot([m["tokens_seen"] for m in evals], [m["eval_loss"] for m in evals], marker="o", ms=3, label=r["name"])
    ax.set_xlabel("tokens (global)")
    ax.set_ylabel("eval loss (global params)")
    ax.set_title("Eval loss vs tokens")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "loss_vs_tokens.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    draw_loss_vs_bytes(ax, rows)
    fig.tight_layout()
    fig.savefig(out_dir / "loss_vs_bytes.png", dpi=120)
    plt.close(fig)


def draw_loss_vs_bytes(ax: Any, rows: Sequence[dict[str, Any]]) -> None:
    """Final eval loss against bytes sent per replica (log x) on ``ax``.

    A method that sends nothing (one replica) has no place on a log axis: it is drawn as a
    dashed horizontal line at its loss, labelled "no communication".
    """
    for i, r in enumerate(rows):
        color, loss = f"C{i % 10}", r["final_eval_loss"]
        if loss is None:  # diverged: no point to draw
            continue
        if r["bytes_sent_per_replica"] > 0:
            ax.scatter([r["bytes_sent_per_replica"]], [loss], s=50, color=color)
            ax.annotate(r["name"], (r["bytes_sent_per_replica"], loss), textcoords="offset points", xytext=(5, 5))
        else:
            ax.axhline(loss, color=color, linestyle="--", linewidth=1)
            ax.annotate(
                f"{r['name']} (no communication)",
                (0.01, loss),
                xycoords=("axes fraction", "data"),
                textcoords="offset points",
                xytext=(0, 4),
                color=color,
            )
    if any(r["bytes_sent_per_replica"] > 0 for r in rows):
        ax.set_xscale("log")
        ax.set_xlabel("bytes sent per replica (log)")
    else:
        ax.set_xticks([])
        ax.set_xlabel("no method sent any bytes")
    ax.set_ylabel("final eval loss")
    ax.set_title("Quality vs communication")
    ax.grid(alpha=0.3, which="both")
