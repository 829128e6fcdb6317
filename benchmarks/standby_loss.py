"""The final loss of runs whose active syncer's host was lost (their standby took over) against the seed spread of the
same runs without the fault (:data:`diloco.testing.standby_hosts.STANDBY_SETS`: ``tiny``, M = 3 one-rank sites,
steps padded to 0.4 s, K = 1 or 2; ``--steps`` long, 160 by default).

Every run is the deployment of tests/hosts/test_deploy_standby.py on emulated hosts (root only,
:func:`diloco.testing.standby_hosts.run_standby_deploy`): the active syncer on host 0, its standby on host 1, a site
on each of hosts 2, 3 and 4 running the printed command. A faulted run kills host 0 whole once every learner passed
a quarter of the steps; a no-fault run is the same deployment, standby attached, without the kill. The same seeds
run both ways (a seed fixes the initial model and each learner's data; a decoupled run is not deterministic in its
timing, and the seeds' spread holds that variation too).

Per K: the no-fault losses, their mean, sample standard deviation and spread (max - min), the band mean ±
max(3 s.d., spread), each faulted loss and whether it lies in the band, and the faulted mean minus the no-fault
mean with its standard error. Also each faulted run's learners' worst step after the kill over their typical step
(their last step apart: a learner's finish waits for its last replies, at K >= 2 for another learner's last report,
fault or not), and every run's learners' last step over their typical step.

Each finished run is appended to ``standby_loss_runs.jsonl`` beside the result (strict JSON, one line a run) and is
not run again: an interrupted sweep goes on where it stopped when started again with the same arguments.

    sudo python benchmarks/standby_loss.py --quorum 1 2   # 3 seeds x (no fault, faulted) x 2 K: about 16 min on 2 cores
    sudo python benchmarks/standby_loss.py --seeds 0 1 2 3 4   # 2 seeds more each way (the runs done are kept)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from diloco.bench import add_out, machine, print_table, write_result
from diloco.files import default_cache_dir
from diloco.seed_stats import difference_se
from diloco.testing.hosts import unavailable
from diloco.testing.standby_hosts import STANDBY_SETS, run_standby_deploy


def band(losses: list[float]) -> dict[str, float]:
    """Mean, sample s.d., spread (max - min) of ``losses`` and the band mean ± max(3 s.d., spread)."""
    mean, sd = statistics.mean(losses), statistics.stdev(losses)
    spread = max(losses) - min(losses)
    half = max(3 * sd, spread)
    return {"mean": mean, "sd": sd, "spread": spread, "low": mean - half, "high": mean + half}


def difference(faulted: list[float], clean: list[float]) -> dict[str, float | None]:
    """The faulted mean minus the no-fault mean and its standard error (Welch's; None with fewer than 2 runs on
    either side)."""
    diff, se = difference_se(faulted, clean)
    return {"diff": diff, "diff_se": se}


def run_key(sets: dict[str, Any], faulted: bool) -> str:
    """What makes a run the same run: its settings (seed and K among them) and whether host 0 is killed."""
    return json.dumps({"sets": sets, "faulted": faulted}, sort_keys=True)


def read_runs(path: Path) -> dict[str, dict[str, Any]]:
    """The runs already in ``path`` by :func:`run_key` (a line cut short by a kill mid-write is skipped)."""
    runs: dict[str, dict[str, Any]] = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            runs[row["key"]] = row
    return runs


def one_run(cache: Path, sets: dict[str, Any], faulted: bool) -> dict[str, Any]:
    """One deployment; its final loss, merges, wall time and (faulted) the takeover's figures."""
    kill = max(1, int(sets["steps"]) // 4) if faulted else None
    got = run_standby_deploy(token_cache=cache, sets=sets, kill_at_step=kill, takeover_s=3.0)
    row: dict[str, Any] = {
        "final_eval_loss": got["final_eval_loss"],
        "merges": len(got["merges"]),
        "epoch": got["epoch"],
        "finished": got["finished"],
        "wall_s": got["wall_s"],
        # each learner's last step: its finish waits for its last replies (at K >= 2 for the others' last reports)
        "last_over_typical": [x["last_step"]["dt"] / x["typical_step_s"] for x in got["learners"]],
    }
    if faulted:
        row |= {
            "kill_at_step": kill,
            "lost_merges": got["lost_merges"],
            "takeover_s": got["takeover_s"],
            "first_merge_after_kill_s": got["first_merge_after_kill_s"],
            "worst_over_typical": [x["worst_over_typical_after_kill"] for x in got["learners"]],  # the last step apart
            "worst_steps": [x["worst_step"] for x in got["learners"]],
        }
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quorum", type=int, nargs="+", default=[1, 2], choices=(1, 2, 3), help="K (default 1 2)")
    ap.add_argument(
        "--seeds", type=int, nargs="+", default=[0, 1, 2], help="seeds, each run with and without the fault"
    )
    ap.add_argument("--steps", type=int, default=160, help="steps of each run (default 160: 64 s of padded steps)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: the CLI's)")
    add_out(ap, "standby_loss")
    args = ap.parse_args()
    if len(args.seeds) < 3:
        ap.error(f"--seeds {' '.join(map(str, args.seeds))}: give 3 seeds or more (a spread of fewer says little)")
    if args.steps < 4 * STANDBY_SETS["sync_every"]:
        ap.error(f"--steps {args.steps}: give at least {4 * STANDBY_SETS['sync_every']} (the kill is at a quarter)")
    if unavailable() is not None:
        ap.error(f"emulated hosts: {unavailable()}")
    cache = args.cache_dir or default_cache_dir()
    runs_path = Path(args.out).with_name(Path(args.out).stem + "_runs.jsonl")
    runs = read_runs(runs_path)
    plan = [
        ({**STANDBY_SETS, "steps": args.steps, "eval_every": args.steps, "quorum": q, "seed": s}, faulted)
        for q in args.quorum
        for s in args.seeds
        for faulted in (False, True)
    ]
    todo = [(sets, f) for sets, f in plan if run_key(sets, f) not in runs]
    print(f"{len(plan)} runs, {len(plan) - len(todo)} already in {runs_path}; {len(todo)} to run")
    began = time.time()
    for i, (sets, faulted) in enumerate(todo):
        row = {"key": run_key(sets, faulted), **one_run(cache, sets, faulted), "machine": machine()}
        with runs_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, allow_nan=False) + "\n")
        runs[row["key"]] = row
        left = (time.time() - began) / (i + 1) * (len(todo) - i - 1)
        what = "faulted" if faulted else "no fault"
        print(
            f"[{i + 1}/{len(todo)}] K = {sets['quorum']} seed {sets['seed']} {what}: loss "
            f"{row['final_eval_loss']:.4f}, {row['merges']} merges, {row['wall_s']:.0f} s; about {left / 60:.0f} min left",
            flush=True,
        )
    rows = []
    for q in args.quorum:
        got = {f: [runs[run_key(sets, f)] for sets, g in plan if g == f and sets["quorum"] == q] for f in (False, True)}
        clean, faulted = ([r["final_eval_loss"] for r in got[f]] for f in (False, True))
        stats = band(clean)
        rows.append(
            {
                "quorum": q,
                "steps": args.steps,
                "seeds": args.seeds,
                "no_fault_losses": clean,
                "no_fault_merges": [r["merges"] for r in got[False]],
                **stats,
                "faulted_losses": faulted,
                "faulted_merges": [r["merges"] for r in got[True]],
                "faulted_within": [stats["low"] <= x <= stats["high"] for x in faulted],
                **difference(faulted, clean),
                "lost_merges": [r["lost_merges"] for r in got[True]],
                "first_merge_after_kill_s": [r["first_merge_after_kill_s"] for r in got[True]],
                # (a run recorded before the last step was left out of it: None)
                "worst_over_typical": [
                    r["worst_over_typical"] if "last_over_typical" in r else None for r in got[True]
                ],
                "last_over_typical": [r.get("last_over_typical") for r in got[False] + got[True]],
                "wall_s": [r["wall_s"] for r in got[False] + got[True]],
            }
        )
    print_table(
        rows,
        [
            ("K", "quorum", "d"),
            ("no-fault losses", lambda r: ", ".join(f"{x:.3f}" for x in r["no_fault_losses"]), ""),
            ("band", lambda r: f"{r['low']:.3f}-{r['high']:.3f}", ""),
            ("faulted losses", lambda r: ", ".join(f"{x:.3f}" for x in r["faulted_losses"]), ""),
            ("within", lambda r: ", ".join("yes" if w else "no" for w in r["faulted_within"]), ""),
            ("faulted - no fault", lambda r: f"{r['diff']:+.4f} ± {r['diff_se']:.4f}", ""),
            ("merges no fault", lambda r: ", ".join(map(str, r["no_fault_merges"])), ""),
            ("merges faulted", lambda r: ", ".join(map(str, r["faulted_merges"])), ""),
            ("worst step / typical", lambda r: f"{max(max(w) for w in r['worst_over_typical'] if w):.2f}", ""),
            ("last step / typical", lambda r: f"{max(max(w) for w in r['last_over_typical'] if w):.2f}", ""),
        ],
        title=f"final eval loss, tiny, M = 3, {args.steps} steps of 0.4 s, host 0 killed at step {args.steps // 4}; "
        f"seeds {args.seeds}",
    )
    write_result(
        "standby_loss",
        {"rows": rows, "machine": machine(), "settings": STANDBY_SETS | {"steps": args.steps}},
        out=args.out,
    )


if __name__ == "__main__":
    main()
