"""What `diloco plan` prints and writes beside plan.json: the table per bandwidth, where the numbers come from,
the measured costs, the syncer's and the goodput's figures, plan.md and plan.png (:mod:`diloco.cli.plan` is the
command)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from diloco.cli.simulate import format_duration, format_gbps
from diloco.sim.loss import MEASURED_CODECS, MEASURED_EAGER, MEASURED_MARK
from diloco.sim.planner import Evaluated, Plan
from diloco.sim.syncer_cost import SyncerPlan


def _row(e: Evaluated, mark: str) -> str:
    flag = "x" if any(t.extrapolated for t in e.loss.terms) else " "
    flag += "m" if e.candidate.measured else ""
    bw90 = "-" if e.bandwidth_for_90_gbps is None else f"{e.bandwidth_for_90_gbps:.3g}"
    return (
        f"{mark} {e.candidate.label:<40}{e.utilization:>7.1%}{format_duration(e.wall_clock_s):>11}"
        f"{e.bytes_sent / 1e12:>10.3g}{e.peak_gbps:>9.3g}{bw90:>8}  {e.loss.loss:.4f} ({e.loss_vs_dp:+.2%}){flag}"
    )


def _kind(e: Evaluated) -> str | None:
    """Which measured setting a row is (eager, or a codec sent with error feedback), None for the others."""
    c = e.candidate
    return "eager" if c.eager else (c.codec if c.codec in MEASURED_CODECS else None)


def format_plan(plan: Plan, top: int) -> str:
    lines = []
    head = f"  {'candidate':<40}{'util':>7}{'wall':>11}{'TB sent':>10}{'peak':>9}{'bw@90%':>8}  loss (vs DP)"
    for bw, rows in plan.rows.items():
        rec = plan.recommended[bw]
        fastest = rows[0]
        lines.append(
            f"\n== {format_gbps(bw)}: recommended {rec.candidate.label}: {rec.utilization:.1%} utilization, "
            f"{format_duration(rec.wall_clock_s)}, loss {rec.loss.loss:.4f} ({rec.loss_vs_dp:+.2%} vs DP"
            + (f"; its loss cost {MEASURED_MARK})" if rec.candidate.measured else ")")
            + (
                f"; outer momentum {rec.candidate.outer_momentum}, {plan.setup.steps / rec.candidate.sync_every:.0f} "
                f"outer steps"
                if rec.candidate.method != "dp"
                else ""
            )
        )
        if fastest is not rec:
            lines.append(
                f"   (fastest at any loss: {fastest.candidate.label}, {format_duration(fastest.wall_clock_s)}, "
                f"loss {fastest.loss_vs_dp:+.2%} vs DP: outside the {plan.tolerance:.2%} tolerance)"
            )
        lines.append(head + "   [peak, bw@90%: Gbit/s]")
        shown = rows[:top] + ([rec] if rec not in rows[:top] else [])
        dp = next(e for e in rows if e.candidate.method == "dp")
        if dp not in shown:
            shown.append(dp)
        kinds = {_kind(e) for e in shown}
        for e in rows:  # the fastest of each measured setting, if none is shown yet (rows are fastest first)
            k = _kind(e)
            if k is not None and k not in kinds:
                kinds.add(k)
                shown.append(e)
        for e in shown:
            lines.append(_row(e, "*" if e is rec else " "))
    return "\n".join(lines)


def format_sources(plan: Plan) -> str:
    s = plan.sources
    any_row = next(iter(plan.rows.values()))
    lines = ["where the numbers come from:"]
    for key in ("step_time", "utilization", "wall_clock", "bytes", "peak", "bandwidth_for_90"):
        lines.append(f"  {key}: {s[key]}")
    lines.append(f"  loss: {s['loss_law']}")
    seen: dict[tuple[str, str], None] = {}
    for e in any_row:
        for t in e.loss.terms:
            seen.setdefault((f"loss {t.name}", t.source))
        for n in e.loss.notes:
            seen.setdefault(("loss note", n))
    for name, src in seen:
        lines.append(f"  {name}: {src}")
    for key in ("syncer_merge_time", "syncer_memory", "syncer_shards"):
        if key in s:
            lines.append(f"  {key}: {s[key]}")
    lines.append("  'x' after a loss: an ablation cost used outside its data (an extrapolation)")
    if "measured" in s:
        lines.append(f"  'm' after a loss: {s['measured']}")
    return "\n".join(lines)


def format_measured(measured: dict) -> str:
    """The frontier study's gaps to data-parallel, as the planner charges them, with their source."""
    rows = measured["rows"]
    used = {MEASURED_EAGER: "eager tau=H", **{v: f"{k}+EF" for k, v in MEASURED_CODECS.items()}}
    lines = [f"{MEASURED_MARK} ({measured['source']}; {measured['setting']}): eval loss vs data-parallel"]
    for key, row in rows.items():
        if key == "dp":
            continue
        note = (
            f"charged to '{used[key]}' candidates"
            if key in used
            else ("the reference the others are charged against" if key == "streaming-fp4-tau1" else "not a candidate")
        )
        lines.append(
            f"  {row['what']:<56}{row['gap_pct']:>+7.2f} %  (tolerates {row['tolerated_steps']} step"
            f"{'s' if row['tolerated_steps'] != 1 else ''}; {note})"
        )
    return "\n".join(lines)


def markdown(plan: Plan) -> str:
    st = plan.setup
    m = st.model
    out = [
        f"# Plan: {m.name}, {st.num_workers} workers",
        "",
        f"{m.num_params:.4g} parameters, {m.num_layers} layers; step time {m.step_time_s:.4g} s "
        f"({st.step_time_source}); {st.tokens:.4g} tokens at {st.tokens_per_step:.4g} per step "
        f"({st.steps:.4g} steps); exchange {st.exchange}; latency {st.latency_s:g} s per hop; "
        f"tolerance {plan.tolerance:.2%} of DP's loss.",
        "",
    ]
    for bw, rows in plan.rows.items():
        rec = plan.recommended[bw]
        out += [
            f"## {format_gbps(bw)}: recommended **{rec.candidate.label}**",
            "",
            "| candidate | utilization | wall-clock | TB sent / worker | peak Gbit/s | Gbit/s for 90 % | "
            "eval loss | vs DP | 90 % interval |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for e in rows:
            iv = "-" if e.loss.interval is None else f"{e.loss.interval[0]:.4f}–{e.loss.interval[1]:.4f}"
            bw90 = "-" if e.bandwidth_for_90_gbps is None else f"{e.bandwidth_for_90_gbps:.3g}"
            name = f"**{e.candidate.label}**" if e is rec else e.candidate.label
            out.append(
                f"| {name} | {e.utilization:.1%} | {format_duration(e.wall_clock_s)} | "
                f"{e.bytes_sent / 1e12:.3g} | {e.peak_gbps:.3g} | {bw90} | {e.loss.loss:.4f} | "
                f"{e.loss_vs_dp:+.2%} | {iv} |"
            )
        out.append("")
    if "measured" in plan.sources:
        out += [f"## Costs {MEASURED_MARK}", "", "```", format_measured(plan.measured), "```", ""]
    out += ["## Sources", "", "```", format_sources(plan), "```", ""]
    return "\n".join(out)


def plot_plan(plan: Plan, path: Path) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from diloco.files import atomic_write_with

    fig = Figure(figsize=(7.5, 4.8), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    markers = {"dp": "s", "diloco": "o", "streaming": "^"}
    for i, (bw, rows) in enumerate(plan.rows.items()):
        color = f"C{i}"
        for method, marker in markers.items():
            pts = [e for e in rows if e.candidate.method == method]
            ax.scatter(
                [e.wall_clock_s / 3600 for e in pts],
                [e.loss.loss for e in pts],
                s=14,
                marker=marker,
                color=color,
                alpha=0.6,
                label=f"{format_gbps(bw)} {method}",
            )
        rec = plan.recommended[bw]
        ax.scatter([rec.wall_clock_s / 3600], [rec.loss.loss], s=120, marker="*", color=color, edgecolor="k", zorder=5)
    dp_loss = next(e.loss.loss for e in next(iter(plan.rows.values())) if e.candidate.method == "dp")
    ax.axhline(dp_loss * (1 + plan.tolerance), color="0.5", ls="--", lw=0.8, label="DP + tolerance")
    ax.set_xscale("log")
    ax.set_xlabel("predicted wall-clock (hours)")
    ax.set_ylabel("predicted eval loss")
    ax.set_title(f"{plan.setup.model.name}, M = {plan.setup.num_workers}: loss vs wall-clock (star: recommended)")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=6, ncol=2, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda fh: fig.savefig(fh, format="png"))
    return path


def _bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.3g} B"


def format_syncer(sp: SyncerPlan, bandwidths_bps: Sequence[float] = ()) -> str:
    """The syncer's costs beside the learners' step time, which bound sets its shard count, and where a standby runs
    and what its copies cost at each link bandwidth."""
    budget, period = sp.tau * sp.step_time_s, sp.sync_every * sp.step_time_s
    # syncer_shards owns whole fragments: the merge bound's S hosts need fragments S times smaller there
    smaller = f", fragments {sp.shards_for_merge}x smaller on syncer_shards" if sp.shards_for_merge > 1 else ""
    why = {
        "merge": f"set by a merge within tau = {sp.tau} steps{smaller}; the load needs {sp.shards_for_load}",
        "load": f"set by the load within H = {sp.sync_every} steps; a merge within tau needs {sp.shards_for_merge}"
        + smaller,
        "both": f"a merge within tau = {sp.tau} steps{smaller} and the load within H = {sp.sync_every} steps need it",
    }[sp.bound]
    lines = [
        f"syncer (method=decoupled): M = {sp.learners} learners, RDA, {sp.codec} replies; {sp.fragments} fragments, "
        f"the largest {sp.fragment_values:.4g} values",
        f"  learners' step time           {format_duration(sp.step_time_s):>10}  ({sp.step_time_source}; "
        f"tau = {sp.tau}: {format_duration(budget)} for a merge)",
        f"  syncer merge per fragment     {format_duration(sp.merge_s):>10}  ({sp.merge_s / budget:.3g} x tau steps, "
        "one host)",
        f"  syncer merges per H steps     {format_duration(sp.load_s):>10}  ({sp.fragments} merges, "
        f"{sp.load_s / period:.3g} x H = {sp.sync_every} steps, one host merging one at a time)",
        f"  syncer memory                 {_bytes(sp.memory_bytes):>10}",
        f"  syncer shards needed          {sp.shards:>10}  ({why})",
    ]
    if sp.shards_note is not None:
        lines.append(f"  ({sp.shards_note})")
    lines.append(
        f"  standby syncer, per shard     {_bytes(sp.standby_copy_bytes):>10}  a copy after each of the shard's merges "
        f"(one every {format_duration(sp.shard_merge_interval_s)}); on a host of another site than the active's "
        "(diloco syncer --standby-of), with as much memory as the syncer"
    )
    for bw in bandwidths_bps:
        copy_s = 8 * sp.standby_copy_bytes / bw
        ratio = copy_s / sp.shard_merge_interval_s
        verdict = "keeps up" if ratio <= 1 else "does not keep up: each reply waits for the copy"
        lines.append(
            f"    at {format_gbps(bw)}: {format_duration(copy_s)} a copy, {ratio:.3g} x the time between merges "
            f"({verdict})"
        )
    return "\n".join(lines)


def format_goodput(report: dict) -> str:
    m = report["model"]
    lines = [
        f"goodput under failures: {report['chips']:.4g} chips, cluster MTBF {report['cluster_mtbf_hours']:.3g} h "
        f"({report['cluster_mtbf_hours'] * 3600:.3g} s), M = {report['learners']}; recovery lognormal median "
        f"{m['recovery_median_s']:g} s (mean {m['recovery_mean_s']:.3g} s), re-scale {m['rescale_s']:g} s, "
        f"checkpoint every {m['checkpoint_interval_s']:g} s (0: every step)"
    ]
    for method, value in report["goodput"].items():
        lines.append(f"  {report['labels'][method]:<48}{value:>7.1%}")
    lines.append("  (wall-clock above assumes no failures: divide it by the goodput of the method you run)")
    return "\n".join(lines)
