"""torchft 0.2.0's DiLoCo with live healing under chaos.py's fault schedule: the ``torchft`` rows.

M replica groups of one process each (``torchft_cluster.Cluster``: a lighthouse in the driver, ``min_replicas``
1, heartbeat timeout 2 s; each process a ``Manager`` with gloo, synchronous quorum, ``init_sync``), each
training the project's tiny transformer on the bundled text as chaos.py's Ray learners do: batch
``global_batch / M`` of random windows of its own share of the tokens, AdamW (weight decay 0.1) with the
warmup and cosine over ``--steps``, each step's compute padded to ``--step-time``; ``torchft.local_sgd.DiLoCo``
with H = 16 and 2 fragments ((embedding, final norm, head) and the blocks, torchft's own split: one fragment
synced every 8 steps), ``fragment_sync_delay`` = τ = 2, outer Nesterov SGD 0.7 / 0.9 per fragment.

The clock starts when every replica is built and has its manager (they wait for each other, as the Ray
learners do). ``kill``: replica 1's process SIGKILLed at 10 s and 25 s, a new process for it spawned 3 s
after each kill: it trains from a fresh model until its first quorum, where it heals from a peer (torchft
asks for a quorum only when it prepares a sync). Equal tokens: the run stops once the replicas have
trained ``steps x global_batch x seq_len`` tokens that reached the global model: a step counts when the
next ``should_commit`` of its process succeeded, and it came after that process's healing, if any (a failed
commit loses its round; a restarted process's steps before it healed were overwritten).

Figures, as for the other rows: final eval loss of torchft's global parameters (the fragments'
``original_parameters``, from replica 0, never killed) on chaos.py's evaluation set; wall (start to the
token budget); goodput (the padded compute of the counted steps / M x wall); per kill the survivors'
longest step that ended in the 10 s after it ÷ their typical step (:func:`diloco.decoupled.chaos_logs.restart_stalls`:
the step whose sync waits for the lighthouse may have begun just before the kill), the share of their
counted steps begun in those 10 s (:func:`diloco.decoupled.chaos_logs.survivor_stalls`), the kill to the new process training (restart_s, with the 3 s) and
from there to its first committed sync (rejoin_s: it contributes), and the kill to its healing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchft_cluster import Cluster, instrumented_manager, read_rows, versions

from diloco.bench import summarize

KILLS = ((10.0, 1), (25.0, 1))
DOWNTIME_S = 3.0


@dataclass(frozen=True)
class ChaosSettings:
    tokens_file: str
    vocab_size: int
    num_replicas: int = 2
    size: str = "tiny"
    seq_len: int = 64
    batch_size: int = 8
    inner_lr: float = 3e-3
    weight_decay: float = 0.1
    warmup_steps: int = 30
    schedule_steps: int = 300
    min_lr_ratio: float = 0.1
    sync_every: int = 16
    fragments: int = 2
    fragment_sync_delay: int = 2
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    step_time_s: float = 0.1
    seed: int = 0
    # lighthouse and manager (torchft_cluster), as in torchft_healing.py
    min_replicas: int = 1
    join_timeout_s: float = 60.0
    quorum_tick_s: float = 0.1
    heartbeat_timeout_s: float = 2.0
    heartbeat_interval_s: float = 0.1
    timeout_s: float = 10.0
    quorum_timeout_s: float = 60.0


# ------------------------------------------------------------------------------------------ replica
def _replica_main(replica: int, incarnation: int, lighthouse: str, run_dir: Path, s: ChaosSettings) -> None:
    import numpy as np
    import torch
    from torchft.local_sgd import DiLoCo

    from diloco.models.factory import build_model
    from diloco.train.lr import cosine_lr

    torch.set_num_threads(1)
    log = open(run_dir / f"replica{replica}.inc{incarnation}.jsonl", "a", buffering=1)

    def write(row: dict) -> None:
        log.write(json.dumps({"learner": replica, "incarnation": incarnation, **row}) + "\n")

    def event(name: str, **fields: Any) -> None:
        write({"event": name, "t": time.time(), **fields})

    event("start", pid=os.getpid())
    tokens = np.load(s.tokens_file, mmap_mode="r")
    share = len(tokens) // s.num_replicas
    rng = np.random.default_rng(s.seed * 1000 + replica * 100 + incarnation)  # the Ray learners' windows
    model = build_model("", size=s.size, vocab_size=s.vocab_size, seq_len=s.seq_len, seed=s.seed)
    inner = torch.optim.AdamW(model.parameters(), lr=s.inner_lr, weight_decay=s.weight_decay)
    frags = [torch.nn.ModuleList([model.embed, model.norm, model.head]), model.blocks] if s.fragments == 2 else [model]
    outers = [torch.optim.SGD(f.parameters(), lr=s.outer_lr, momentum=s.outer_momentum, nesterov=True) for f in frags]
    step = [0]

    def load_state_dict(sd: dict) -> None:  # healing: the peer's model, AdamW state and step
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["inner"])
        step[0] = sd["step"]

    manager = instrumented_manager(
        replica=replica,
        lighthouse=lighthouse,
        s=s,
        load_state_dict=load_state_dict,
        event=event,
        state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict(), "step": step[0]},
    )
    clock: dict[str, float] = {}

    def pad(*_: Any) -> None:  # before DiLoCo's hook: the compute is padded, the sync comes on top
        time.sleep(max(0.0, clock["begin"] + s.step_time_s - time.perf_counter()))
        clock["padded"] = time.perf_counter()

    pad_hook = inner.register_step_post_hook(pad)
    stop, go = run_dir / "stop", run_dir / "go"
    event("ready")
    while not go.exists():  # the first incarnations start together
        time.sleep(0.01)
    try:
        with DiLoCo(
            manager,
            frags,
            inner,
            outers,
            sync_every=s.sync_every,
            backup_device=torch.device("cpu"),
            pin_memory=False,
            fragment_sync_delay=s.fragment_sync_delay,
        ) as diloco:
            event("joined")
            while not stop.exists():
                clock["begin"] = time.perf_counter()
                for group in inner.param_groups:
                    group["lr"] = cosine_lr(
                        step[0] + 1,
                        peak=s.inner_lr,
                        warmup_steps=s.warmup_steps,
                        total_steps=s.schedule_steps,
                        min_lr_ratio=s.min_lr_ratio,
                    )
                starts = replica * share + rng.integers(0, share - s.seq_len - 1, size=s.batch_size)
                block = torch.from_numpy(np.stack([tokens[i : i + s.seq_len + 1] for i in starts]).astype(np.int64))
                _, loss = model(block[:, :-1], block[:, 1:])
                loss.backward()
                inner.step()
                inner.zero_grad()
                step[0] += 1
                end = time.perf_counter()
                write(
                    {
                        "step": step[0],
                        "t": time.time(),
                        "dt": end - clock["begin"],
                        "compute_s": clock["padded"] - clock["begin"],
                        "sync_s": end - clock["padded"],
                        "outer_step": manager.current_step(),
                        "tokens": s.batch_size * s.seq_len,
                        "loss": round(float(loss), 4),
                    }
                )
            if replica == 0:  # torchft's global parameters: each fragment's copy as of its last sync
                names = {id(p): n for n, p in model.named_parameters()}
                state = {
                    names[id(p)]: frag.original_parameters[n].clone()
                    for frag, module in zip(diloco._fragments, frags, strict=True)
                    for n, p in module.named_parameters()
                }
                torch.save(state, run_dir / "global.pt.tmp")
                os.replace(run_dir / "global.pt.tmp", run_dir / "global.pt")
        event("stop", steps=step[0])
    finally:
        pad_hook.remove()
        manager.shutdown(wait=False)
        log.close()


# ------------------------------------------------------------------------------------------- driver
def _all_rows(run_dir: Path) -> list[dict]:
    return [r for p in sorted(run_dir.glob("replica*.inc*.jsonl")) for r in read_rows(p)]


def torchft_run(*, M: int, fault: str, args: Any, data: Any, work: Path) -> dict[str, Any]:
    """One run of M torchft replicas under ``fault`` (``kill`` or ``none``); chaos.py's row."""
    import numpy as np
    import torch

    from diloco.data.shards import eval_batches
    from diloco.decoupled.chaos_logs import committed_steps, restart_stalls, survivor_stalls
    from diloco.models.factory import build_model
    from diloco.train.evaluation import evaluate_parameters

    run_dir = work / f"torchft-m{M}-{fault}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    np.save(run_dir / "train.npy", np.asarray(data.train))
    s = ChaosSettings(
        tokens_file=str(run_dir / "train.npy"),
        vocab_size=data.vocab_size,
        num_replicas=M,
        size=args.size,
        seq_len=args.seq_len,
        batch_size=args.global_batch // M,
        inner_lr=args.inner_lr,
        warmup_steps=args.steps // 10,
        schedule_steps=args.steps,
        sync_every=args.sync_every,
        fragments=args.fragments,
        fragment_sync_delay=args.overlap,
        step_time_s=args.step_time,
    )
    total = args.steps * args.global_batch * args.seq_len
    cluster = Cluster(s, run_dir, script=Path(__file__).resolve())
    faults: list[dict[str, Any]] = []
    live = {m: 0 for m in range(M)}
    try:
        for m in range(M):
            cluster.spawn(m, 0)
        deadline = time.time() + 300
        while not all(any(r.get("event") == "ready" for r in cluster.rows(m, 0)) for m in range(M)):
            cluster.check_alive(*((m, 0) for m in range(M)))
            if time.time() > deadline:
                raise TimeoutError(f"torchft replicas not ready after 300 s; see {run_dir}")
            time.sleep(0.05)
        started = time.time()
        (run_dir / "go").touch()
        events = list(KILLS if fault == "kill" else ())
        restarts: list[tuple[float, int]] = []
        deadline = started + args.steps * args.step_time * 10 + 300
        next_count = 0.0
        while True:
            now = time.time()
            if events and now >= started + events[0][0]:
                _, m = events.pop(0)
                at = cluster.kill(m, live[m])
                faults.append({"at": at, "target": "learner", "index": m, "restarted_as": live[m] + 1})
                restarts.append((at + DOWNTIME_S, m))
            if restarts and now >= restarts[0][0]:
                _, m = restarts.pop(0)
                live[m] += 1
                cluster.spawn(m, live[m])
            cluster.check_alive(*((m, live[m]) for m in range(M) if not any(r[1] == m for r in restarts)))
            if now >= next_count:  # the token budget, as chaos.py's Ray driver watches it: 4 times a second
                next_count = now + 0.25
                if sum(r["tokens"] for r in committed_steps(_all_rows(run_dir))) >= total:
                    break
            if now > deadline:
                raise TimeoutError(f"torchft run still going; see {run_dir}")
            time.sleep(0.05)
        wall = time.time() - started
        (run_dir / "stop").touch()
        for _ in range(300):
            if (run_dir / "global.pt").exists():
                break
            time.sleep(0.1)
    finally:
        cluster.close()
    rows = _all_rows(run_dir)
    kept = committed_steps(rows)
    steps = [r for r in rows if "step" in r]
    kills = []
    for i, f in enumerate(faults):
        until = faults[i + 1]["at"] if i + 1 < len(faults) else None
        # the longest step that ended after the kill: the step whose sync waits may have begun just before it
        worst = restart_stalls(steps, kill_at=f["at"], killed=f["index"], window_s=10.0, until=until)
        kept_share = survivor_stalls(kept, kill_at=f["at"], killed=f["index"], window_s=10.0, until=until)
        new = sorted(
            (r for r in rows if r["learner"] == f["index"] and r["incarnation"] == f["restarted_as"]),
            key=lambda r: r["t"],
        )

        def first(name: str, pred=lambda r: True, new=new) -> float | None:
            return next((r["t"] for r in new if r.get("event") == name and pred(r)), None)

        joined, healed = first("joined"), first("healed")
        contributes = first("sync", lambda r: r["committed"])
        end = f["at"] + 10.0 if until is None else min(f["at"] + 10.0, until)
        syncs = [r for r in rows if r.get("event") == "sync" and r["learner"] != f["index"] and f["at"] <= r["t"] < end]
        kills.append(
            {
                "learner": f["index"],
                "worst_step_ratio": max((st.worst_step_ratio for st in worst), default=None),
                "steps_kept": min((st.steps_kept for st in kept_share), default=None),
                "restart_s": None if joined is None else joined - f["at"],
                "rejoin_s": None if joined is None or contributes is None else contributes - joined,
                "healed_s": None if healed is None else healed - f["at"],
                "survivors_failed_syncs": sum(1 for r in syncs if not r["committed"]),
                "survivors_syncs": len(syncs),
                "survivors_healed": sum(
                    1
                    for r in rows
                    if r.get("event") == "healed" and r["learner"] != f["index"] and f["at"] <= r["t"] < end
                ),
                "first_error": next((r["error"] for r in syncs if r["error"]), None),
            }
        )
    loss = None
    if (run_dir / "global.pt").exists():
        params = torch.load(run_dir / "global.pt")
        template = build_model("", size=args.size, vocab_size=data.vocab_size, seq_len=args.seq_len, seed=0)
        val = list(eval_batches(data.val, batch_size=args.global_batch // M, seq_len=args.seq_len, max_batches=16 * M))
        loss = evaluate_parameters(template, params, val, bf16=False, device=torch.device("cpu"))
    typical = summarize(r["dt"] for r in steps).median if steps else None  # the step times this run logged
    return {
        "method": "torchft",
        "M": M,
        "fault": fault,
        "eval_loss": loss,
        "wall_s": wall,
        "goodput": sum(r["compute_s"] for r in kept) / (M * wall),
        "lost_steps": len(steps) - len(kept),
        "merges": sum(1 for r in rows if r.get("event") == "sync" and r["committed"] and r["learner"] == 0),
        "steps": {str(m): sum(1 for r in steps if r["learner"] == m) for m in range(M)},
        "kills": kills,
        "typical_step_s": typical,
        "versions": versions(),
        "settings": {
            "sync_every": s.sync_every,
            "fragments": s.fragments,
            "fragment_sync_delay": s.fragment_sync_delay,
            "heartbeat_timeout_s": s.heartbeat_timeout_s,
        },
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--replica", type=int, required=True)
    p.add_argument("--incarnation", type=int, default=0)
    p.add_argument("--lighthouse", required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--settings", required=True)
    a = p.parse_args(argv)
    _replica_main(a.replica, a.incarnation, a.lighthouse, a.run_dir, ChaosSettings(**json.loads(a.settings)))


if __name__ == "__main__":  # one replica process (the driver is chaos.py)
    sys.exit(main())
