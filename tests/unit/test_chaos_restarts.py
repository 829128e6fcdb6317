"""What the logs say about a run that recovers by restarting every worker from its last checkpoint
(data-parallel under TorchElastic), and about replicas that commit at syncs and heal from a peer (torchft),
on synthetic step rows whose figures have closed forms."""

from __future__ import annotations

import pytest

from diloco.decoupled.chaos_logs import committed_steps, final_steps, restart_kill, restart_stalls, summarize_restarts

STEP, M = 0.1, 3


def _run(
    *, kill_step: int, checkpoint: int, down: float, total: int, compute: float = STEP
) -> tuple[list[dict], float]:
    """M workers in lockstep, a step every STEP s from t = 0; worker 1 is killed while step ``kill_step`` runs
    (at t = (kill_step - 0.5) * STEP); every worker joins again ``down`` s after the kill, resumes from
    ``checkpoint`` and trains to ``total``. Returns the rows and the kill's time."""
    rows = []
    kill_at = (kill_step - 0.5) * STEP
    for m in range(M):
        rows.append({"learner": m, "incarnation": 0, "event": "joined", "t": 0.0})
        rows += [
            {"learner": m, "incarnation": 0, "step": s, "t": s * STEP, "dt": STEP, "compute_s": compute}
            for s in range(1, kill_step)
        ]
        back = kill_at + down
        rows.append({"learner": m, "incarnation": 1, "event": "joined", "t": back})
        rows += [
            {
                "learner": m,
                "incarnation": 1,
                "step": s,
                "t": back + (s - checkpoint) * STEP,
                "dt": STEP,
                "compute_s": compute,
            }
            for s in range(checkpoint + 1, total + 1)
        ]
    return rows, kill_at


def test_the_final_trajectory_keeps_each_steps_last_execution():
    rows, _ = _run(kill_step=40, checkpoint=30, down=5.0, total=60)
    kept, superseded = final_steps(rows)
    assert len(kept) == M * 60
    assert superseded == M * (39 - 30)  # steps 31..39 ran twice
    assert all(r["incarnation"] == (1 if r["step"] > 30 else 0) for r in kept)


@pytest.mark.parametrize("kill_step, checkpoint, down", [(140, 130, 5.05), (140, 139, 2.05), (140, 0, 7.55)])
def test_goodput_stalls_and_restart_in_closed_form(kill_step, checkpoint, down):
    total = kill_step + 150  # the 10 s after the kill are full of steps; so are the 10 s before it
    rows, kill_at = _run(kill_step=kill_step, checkpoint=checkpoint, down=down, total=total, compute=0.08)
    wall = kill_at + down + (total - checkpoint) * STEP
    s = summarize_restarts(rows, [{"at": kill_at, "target": "learner", "index": 1}], num_workers=M, wall_s=wall)
    assert s["lost_steps"] == M * (kill_step - 1 - checkpoint)
    assert s["goodput"] == pytest.approx(M * total * 0.08 / (M * wall))
    (k,) = s["learner_kills"]
    # the survivors' first step after the kill ends down + STEP after the kill, 0.5 STEP after their last one
    assert k["worst_step_ratio"] == pytest.approx((0.5 * STEP + down + STEP) / STEP)
    # in the 10 s after the kill they end floor((10 - down) / STEP) steps, all kept, against 10 / STEP before
    assert k["steps_kept"] == pytest.approx(((10 - down) // STEP) / (10 / STEP))
    assert k["restart_s"] == pytest.approx(down)
    assert k["rejoin_s"] == pytest.approx(STEP)
    assert k["redone_steps"] == kill_step - 1 - checkpoint
    # past step kill_step - 1 with the step after it: kill_step - checkpoint steps after the restart
    assert k["caught_up_s"] == pytest.approx(down + (kill_step - checkpoint) * STEP)


def test_work_superseded_by_a_second_restart_is_not_kept_and_its_worker_contributes_only_after_it():
    """Killed at step 40 (restart from 0 after 3 s), and again at step 20 of the new life (from 0 again)."""
    rows = []
    for m in range(2):
        rows.append({"learner": m, "incarnation": 0, "event": "joined", "t": 0.0})
        rows += [
            {"learner": m, "incarnation": 0, "step": s, "t": s * STEP, "dt": STEP, "compute_s": STEP}
            for s in range(1, 40)
        ]
        rows.append({"learner": m, "incarnation": 1, "event": "joined", "t": 7.0})
        rows += [
            {"learner": m, "incarnation": 1, "step": s, "t": 7.0 + s * STEP, "dt": STEP, "compute_s": STEP}
            for s in range(1, 20)
        ]
        rows.append({"learner": m, "incarnation": 2, "event": "joined", "t": 12.0})
        rows += [
            {"learner": m, "incarnation": 2, "step": s, "t": 12.0 + s * STEP, "dt": STEP, "compute_s": STEP}
            for s in range(1, 51)
        ]
    faults = [{"at": 3.95, "target": "learner", "index": 1}, {"at": 8.95, "target": "learner", "index": 1}]
    s = summarize_restarts(rows, faults, num_workers=2, wall_s=17.0)
    assert s["lost_steps"] == 2 * (39 + 19)
    first, second = s["learner_kills"]
    assert first["steps_kept"] == 0.0  # the window ends at the next kill: everything in it was trained again
    assert first["restart_s"] == pytest.approx(7.0 - 3.95)
    assert first["rejoin_s"] == pytest.approx(12.0 + STEP - 7.0)  # its first kept step is in the third life
    assert first["caught_up_s"] == pytest.approx(12.0 + 40 * STEP - 3.95)
    assert second["redone_steps"] == 19 and second["rejoin_s"] == pytest.approx(STEP)


def test_a_survivor_whose_restart_ends_after_the_window_kept_nothing_and_its_stall_is_that_step():
    rows, kill_at = _run(kill_step=40, checkpoint=30, down=12.0, total=45)
    (stall,) = [st for st in restart_stalls(rows, kill_at=kill_at, killed=1, window_s=10.0) if st.learner == 0]
    assert stall.steps_kept == 0.0
    assert stall.worst_step_ratio == pytest.approx((0.5 * STEP + 12.0 + STEP) / STEP)


def test_bad_arguments_are_refused():
    rows, kill_at = _run(kill_step=10, checkpoint=0, down=1.0, total=20)
    with pytest.raises(ValueError, match="num_workers"):
        summarize_restarts(rows, [], num_workers=0, wall_s=1.0)
    with pytest.raises(ValueError, match="wall_s"):
        summarize_restarts(rows, [], num_workers=M, wall_s=0.0)
    with pytest.raises(ValueError, match="no syncer"):
        summarize_restarts(rows, [{"at": 1.0, "target": "syncer", "index": 0}], num_workers=M, wall_s=3.0)
    with pytest.raises(ValueError, match="window_s"):
        restart_stalls(rows, kill_at=kill_at, killed=1, window_s=0.0)
    with pytest.raises(TypeError):
        restart_kill(rows, kill_at, 1)  # keyword-only


@pytest.mark.parametrize("H, rounds, failed", [(8, 5, ()), (8, 5, (2,)), (4, 7, (0, 6))])
def test_committed_steps_count_rounds_that_committed_and_only_steps_after_healing(H, rounds, failed):
    """A survivor syncs every H steps, its rounds in ``failed`` not committed; a restarted process trains 3 steps,
    heals, trains H - 3 more, commits, then trains 2 steps and is killed (no sync after them)."""
    t, rows = 0.0, []
    for k in range(rounds):
        for _ in range(H):
            t += 1.0
            rows.append({"learner": 0, "incarnation": 0, "step": len(rows), "t": t})
        rows.append({"learner": 0, "incarnation": 0, "event": "sync", "committed": k not in failed, "t": t + 0.5})
    survivor = committed_steps(rows)
    assert len(survivor) == H * (rounds - len(failed))
    new = [{"learner": 1, "incarnation": 1, "step": i, "t": float(i)} for i in range(1, 4)]
    new.append({"learner": 1, "incarnation": 1, "event": "healed", "t": 3.5})
    new += [{"learner": 1, "incarnation": 1, "step": i, "t": float(i)} for i in range(4, H + 1)]
    new.append({"learner": 1, "incarnation": 1, "event": "sync", "committed": True, "t": H + 0.5})
    new += [{"learner": 1, "incarnation": 1, "step": i, "t": float(i)} for i in (H + 1, H + 2)]
    restarted = committed_steps(new[::-1])  # any order: each process's rows are taken in time order
    assert sorted(r["step"] for r in restarted) == list(range(4, H + 1))
    assert len(committed_steps(rows + new)) == len(survivor) + H - 3
