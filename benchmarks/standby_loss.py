"""The final loss of a run whose active syncer's host was lost (its standby took over) against the no-fault run's
seed spread, at the same settings (:data:`diloco.testing.standby_hosts.STANDBY_SETS`: ``tiny``, M = 3 one-rank
sites, 64 steps padded to 0.4 s, K = 1 or 2).

The no-fault runs, one per seed: the syncer service and three site jobs running its printed commands, as deployed,
on this machine's loopback (:func:`diloco.decoupled.site_faults.run_sites`, no fault; ``--deploy hosts``: on
emulated hosts with the standby attached, the faulted run's own deployment without the kill, root only). Loopback
is that deployment without the namespaces and the standby: the same processes, code and settings, the same padded
steps (so the same pace and schedule of merges; a decoupled run is not deterministic in its timing, and the seeds'
spread holds that variation too). The faulted run: benchmarks/site_faults.py's row "active syncer host lost, standby takes over (K = k)"
(emulated hosts, root only; seed 0, the default), read from its result file; run that first.

Per K: the seeds' final losses, their mean, sample standard deviation and spread (max - min), the band mean ±
max(3 s.d., spread), and whether the faulted run's final loss lies in it.

    sudo python benchmarks/site_faults.py --runs standby   # the faulted rows, about 150 s (root: emulated hosts)
    python benchmarks/standby_loss.py --quorum 1           # 3 no-fault seeds at K = 1, about 150 s on 2 cores
    python benchmarks/standby_loss.py --quorum 2           # the same at K = 2 (the file keeps the other K's row)
    sudo python benchmarks/standby_loss.py --deploy hosts  # the no-fault runs on emulated hosts, about 6 min
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from diloco.bench import RESULTS_DIR, add_out, machine, print_table, write_result
from diloco.decoupled.site_faults import Site, run_sites
from diloco.files import default_cache_dir
from diloco.testing.hosts import unavailable
from diloco.testing.standby_hosts import STANDBY_SETS, run_standby_deploy


def band(losses: list[float]) -> dict[str, float]:
    """Mean, sample s.d., spread (max - min) of ``losses`` and the band mean ± max(3 s.d., spread)."""
    mean, sd = statistics.mean(losses), statistics.stdev(losses)
    spread = max(losses) - min(losses)
    half = max(3 * sd, spread)
    return {"mean": mean, "sd": sd, "spread": spread, "low": mean - half, "high": mean + half}


def faulted_row(path: Path, quorum: int) -> dict[str, Any]:
    """The faulted run's row at ``quorum`` in site_faults.py's result ({} where the file or the row is missing, or
    it ran with other settings than these)."""
    if not path.is_file():
        return {}
    result = json.loads(path.read_text())
    if result.get("settings", {}).get("standby") != STANDBY_SETS:
        return {}
    name = f"active syncer host lost, standby takes over (K = {quorum})"
    return next((r for r in result.get("rows", []) if r["run"] == name), {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quorum", type=int, nargs="+", default=[1], choices=(1, 2, 3), help="K (each about 150 s)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="the no-fault runs' seeds (3 or more)")
    ap.add_argument("--faulted", type=Path, default=RESULTS_DIR / "site_faults.json", help="site_faults.py's result")
    ap.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: the CLI's)")
    ap.add_argument(
        "--deploy",
        choices=("loopback", "hosts"),
        default="loopback",
        help="where the no-fault runs run: this machine's loopback, or emulated hosts with the standby attached "
        "(root; the faulted run's own deployment, about 2 min a seed)",
    )
    add_out(ap, "standby_loss")
    args = ap.parse_args()
    if len(args.seeds) < 3:
        ap.error(f"--seeds {' '.join(map(str, args.seeds))}: give 3 seeds or more (a spread of fewer says little)")
    if args.deploy == "hosts" and unavailable() is not None:
        ap.error(f"--deploy hosts: {unavailable()}")
    cache = args.cache_dir or default_cache_dir()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for quorum in args.quorum:
            losses, merges, walls = [], [], []
            for seed in args.seeds:
                sets = {**STANDBY_SETS, "quorum": quorum, "seed": seed}
                if args.deploy == "hosts":  # the faulted run's own deployment, standby attached, no kill
                    got = run_standby_deploy(token_cache=cache, sets=sets, kill_at_step=None, takeover_s=3.0)
                    got["merges"] = len(got["merges"])
                else:
                    got = run_sites(
                        preset="tiny",
                        sets=sets,
                        out=Path(tmp) / f"k{quorum}-seed{seed}",
                        cache_dir=cache,
                        sites=[Site(m) for m in range(STANDBY_SETS["replicas"])],
                    )
                losses.append(got["final_eval_loss"])
                merges.append(got["merges"])
                walls.append(got["wall_s"])
            stats = band(losses)
            row = faulted_row(args.faulted, quorum)
            faulted = row.get("final_eval_loss")
            within = None if faulted is None else stats["low"] <= faulted <= stats["high"]
            rows.append(
                {
                    "quorum": quorum,
                    "deploy": args.deploy,
                    "seeds": args.seeds,
                    "no_fault_losses": losses,
                    "no_fault_merges": merges,
                    **stats,
                    "faulted_loss": faulted,
                    "faulted_within": within,
                    "faulted_merges": row.get("merges"),
                    "no_fault_wall_s": walls,
                }
            )
    print_table(
        rows,
        [
            ("K", "quorum", "d"),
            ("no-fault runs on", "deploy", ""),
            ("no-fault mean", "mean", ".4f"),
            ("s.d.", "sd", ".4f"),
            ("spread", "spread", ".4f"),
            ("band low", "low", ".4f"),
            ("band high", "high", ".4f"),
            ("faulted (standby took over)", "faulted_loss", ".4f"),
            ("within", "faulted_within", ""),
            ("merges no fault", lambda r: ", ".join(map(str, r.get("no_fault_merges", []))), ""),
            ("merges faulted", "faulted_merges", ""),
        ],
        title=f"final eval loss, tiny, M = 3, 64 steps of 0.4 s; no fault: seeds {args.seeds}",
    )
    write_result("standby_loss", _kept(args.out, rows) | {"settings": STANDBY_SETS}, out=args.out)


def _kept(path: Path, rows: list[dict]) -> dict:
    """``rows`` (each with this machine) and the previous result's rows of the other K's (each with its machine)."""
    here = machine()
    fresh = [{**r, "machine": here} for r in rows]
    previous = json.loads(Path(path).read_text()) if Path(path).is_file() else {}
    if previous.get("settings") != STANDBY_SETS:
        previous = {}
    done = {(r["quorum"], r["deploy"]) for r in rows}
    kept = [r for r in previous.get("rows", []) if (r["quorum"], r.get("deploy", "loopback")) not in done]
    return {"rows": kept + fresh}


if __name__ == "__main__":
    main()
