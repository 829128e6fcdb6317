"""Decoupled DiLoCo deployed as site jobs, with and without faults: the syncer service and two site jobs of 2 gloo
ranks each (site 0's ranks shard one model with FSDP), on this machine's loopback
(:mod:`diloco.decoupled.site_faults`). The faulted run SIGKILLs learner 1's lead rank after step 12 (torchrun
restarts its job, which resumes from its checkpoint) and then the syncer's process (Ray restarts it from its
checkpoint). One row per run: the final loss of the syncer's parameters, each learner's waiting share and worst
step after each fault over its typical step, the restarted learner's seconds to its first merge, wall time.

A third row, "K = M, a site lost for good" (:mod:`diloco.decoupled.site_lost`): three one-rank sites, every merge
waiting for every learner alive; site 2's whole job is SIGKILLed after step 12 and not restarted, so the others wait
for it until the learner lease (auto: 5 s above the slowest step) lets it go. Its figures: the lease, the seconds
from the kill to the first merge without it (about the lease + 2 s of confirmation + one round), a round (the median
seconds between merges before the kill), and, once its command is run again, the seconds from its join to its first
merge with weight > 0.

Rows "active syncer host lost, standby takes over (K = 1, 2)" (root only: emulated hosts,
:mod:`diloco.testing.standby_hosts`, the run of tests/hosts/test_deploy_standby.py): the active syncer on host 0,
its standby (``--standby-of``) on host 1, a site of one rank on each of hosts 2, 3 and 4 (M = 3); host 0 killed
whole at step 16 of 64. The final loss, each learner's worst step after the kill over its typical step (it rides
the switch out: ``ride_out_steps`` = 32 steps of 0.4 s, more than the takeover takes; its last step apart, where its
finish waits for the last replies, fault or not), the seconds from the kill to
the takeover, to the standby's actor started from its copy and to its first merge, the merges the active made that
the standby lacked (told to no learner), the bytes of a copy. benchmarks/standby_loss.py compares the final loss
with the no-fault run's seed spread.

    python benchmarks/site_faults.py                  # every run, about 150 s on 2 cores, plus ~150 s as root
    python benchmarks/site_faults.py --runs lost      # only the lost site's row (the file's other rows are kept)
    python benchmarks/site_faults.py --runs standby   # only the standby rows (the same)
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from diloco.bench import add_out, machine, print_table, write_result
from diloco.decoupled.site_faults import DEFAULT_SETS, Site, run_sites
from diloco.decoupled.site_lost import LOST_SETS, run_site_lost
from diloco.files import default_cache_dir
from diloco.testing.standby_hosts import STANDBY_SETS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache-dir", type=Path, default=None, help="token cache (default: the CLI's)")
    ap.add_argument(
        "--runs",
        nargs="+",
        choices=("none", "killed", "lost", "standby"),
        default=["none", "killed", "lost", "standby"],
        help="which rows (the result file's other rows are kept)",
    )
    add_out(ap, "site_faults")
    args = ap.parse_args()
    sites = [Site(0, ranks=2, sharding="fsdp"), Site(1, ranks=2)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key, name, faults in (
            ("none", "no faults", {}),
            ("killed", "rank and syncer killed", {"kill_learner": (1, 12), "kill_syncer": True}),
        ):
            if key not in args.runs:
                continue
            got = run_sites(
                preset="tiny",
                sets=DEFAULT_SETS,
                out=Path(tmp) / name.replace(" ", "-"),
                cache_dir=args.cache_dir or default_cache_dir(),
                sites=sites,
                **faults,
            )
            kill = got["faults"].get("learner_kill", {})
            rows.append(
                {
                    "run": name,
                    "final_eval_loss": got["final_eval_loss"],
                    "merges": got["merges"],
                    "versions_contiguous": got["versions_contiguous"],
                    "wait_share_0": got["learners"][0]["wait_share"],
                    "wait_share_1": got["learners"][1]["wait_share"],
                    "learner0_worst_after_rank_kill": got["learners"][0].get("worst_step_after_learner_kill"),
                    "learner0_worst_after_syncer_kill": got["learners"][0].get("worst_step_after_syncer_kill"),
                    "learner1_worst_after_syncer_kill": got["learners"][1].get("worst_step_after_syncer_kill"),
                    "restarted_from_step": kill.get("start_step"),
                    "first_merge_after_restart_s": kill.get("first_merge_s"),
                    "lr_matches_schedule": kill.get("lr_matches_schedule"),
                    "superseded_steps": got["learners"][1]["superseded"],
                    "wall_s": got["wall_s"],
                    "faults": got["faults"],
                }
            )
        if "lost" in args.runs:
            got = run_site_lost(
                preset="tiny", sets=LOST_SETS, out=Path(tmp) / "lost", cache_dir=args.cache_dir or default_cache_dir()
            )
            rows.append({"run": "K = M, a site lost for good", **got})
        if "standby" in args.runs:
            rows += standby_rows(Path(tmp))
    print_table(
        rows,
        [
            ("run", "run", ""),
            ("final loss", "final_eval_loss", ".4f"),
            ("merges", "merges", "d"),
            ("wait 0", "wait_share_0", ".3f"),
            ("wait 1", "wait_share_1", ".3f"),
            ("L0 worst/typ (rank kill)", "learner0_worst_after_rank_kill", ".2f"),
            ("L0 worst/typ (syncer kill)", "learner0_worst_after_syncer_kill", ".2f"),
            ("L1 worst/typ (syncer kill)", "learner1_worst_after_syncer_kill", ".2f"),
            ("L2 worst/typ (syncer kill)", "learner2_worst_after_syncer_kill", ".2f"),
            ("restart: from step", "restarted_from_step", ""),
            ("first merge s", "first_merge_after_restart_s", ".1f"),
            ("lease s", "lease_s", ".1f"),
            ("round s", "round_s", ".2f"),
            ("kill -> merge without it s", "kill_to_merge_without_s", ".1f"),
            ("join -> counted s", "join_to_counted_s", ".1f"),
            ("lost merges", "lost_merges", ""),
            ("takeover s", "takeover_s", ".1f"),
            ("wall s", "wall_s", ".1f"),
        ],
        title="site jobs: 2 sites x 2 gloo ranks (site 0 FSDP), K = 1, steps padded to 0.15 s; "
        "K = M: 3 sites x 1 rank, steps padded to 0.1 s",
    )
    settings = {"faults": DEFAULT_SETS, "lost": LOST_SETS, "standby": STANDBY_SETS}
    write_result("site_faults", kept_rows(args.out, rows) | {"settings": settings}, out=args.out)


def kept_rows(path: Path, rows: list[dict]) -> dict:
    """The result to write: ``rows``, and the previous result's other rows (each with the machine it ran on), so
    one file holds every row whichever ``--runs`` were run."""
    import json

    here = machine()
    fresh = [{**r, "machine": here} for r in rows]
    if not Path(path).is_file():
        return {"machine": here, "rows": fresh}
    previous = json.loads(Path(path).read_text())
    names = {r["run"] for r in rows}
    old = [{"machine": previous.get("machine"), **r} for r in previous.get("rows", []) if r["run"] not in names]
    return {"machine": here, "rows": old + fresh}


def standby_rows(tmp: Path) -> list[dict]:
    """The rows "active syncer host lost, standby takes over" (none, saying why, without emulated hosts)."""
    from diloco.testing.hosts import unavailable

    why = unavailable()
    if why is not None:
        print(f"standby rows skipped: {why}")
        return []
    from diloco.data import prepare_tokens
    from diloco.testing.deploy_env import contiguous
    from diloco.testing.standby_hosts import run_standby_deploy
    from diloco.train.config import TrainConfig, load_preset

    cfg = TrainConfig.from_dict(load_preset("tiny")["base"])
    cache = tmp / "token-cache"
    prepare_tokens(cfg.sources, cfg.vocab_size, cache, val_fraction=cfg.val_fraction)
    rows = []
    steps = STANDBY_SETS["steps"]
    for quorum in (1, 2):
        got = run_standby_deploy(
            token_cache=cache, sets={**STANDBY_SETS, "quorum": quorum}, kill_at_step=16, takeover_s=3.0
        )
        copied = got["standby"] or {}
        worst = [x["worst_over_typical_after_kill"] for x in got["learners"]]
        rows.append(
            {
                "run": f"active syncer host lost, standby takes over (K = {quorum})",
                "final_eval_loss": got["final_eval_loss"],
                "merges": len(got["merges"]),
                "versions_contiguous": contiguous(got["merges"]),
                **{f"learner{m}_worst_after_syncer_kill": w for m, w in enumerate(worst)},
                "lost_merges": got["lost_merges"],
                "restored_merges": got["restored_merges"],
                "takeover_s": got["takeover_s"],
                "actor_started_after_kill_s": got["actor_started_after_kill_s"],
                "first_merge_after_restart_s": got["first_merge_after_kill_s"],
                "every_step_once": all(x["steps"] == list(range(1, steps + 1)) for x in got["learners"]),
                "copies": copied.get("copies"),
                "bytes_per_copy": copied.get("bytes_received", 0) / max(1, copied.get("copies") or 0),
                "wall_s": got["wall_s"],
            }
        )
    return rows


if __name__ == "__main__":
    main()
