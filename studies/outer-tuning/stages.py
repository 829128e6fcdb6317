"""The staged search of the outer optimizer: print what the results say, and write the next stage's grids.

A full factorial (inner lr x outer lr x outer momentum x warmup, per method) is ~200 runs, hours on this
machine; this search goes one coordinate at a time, each stage at the previous stage's best, and
brackets every optimum (a best value at the edge of what was tried gets the next value out):

    stage 1  inner lr per method at outer lr 0.7 / Nesterov 0.5          (grids s1-*, written by hand)
    stage 2  outer lr {0.5, 0.7, 1.0} x outer momentum {0, 0.5, 0.9} at the stage-1 inner lr
    stage 3  warmup {15, 60} (30 so far) and inner lr x 1/2, x 2 at the best outer settings; an outer lr at
             the edge of stage 2's grid gets one more (x 1.4 or / 1.4)
    stage 4  one step past every edge the best still sits on (write_bracket)
    stage 5  the same again, and the inner lr x 1/2, x 2 where it was tried at one value only at the best's
             warmup (stage 4 moved warmup to 120 at a fixed inner lr)
    stage 6  the same once more (stage 5 moved warmup to 240 and M = 1's inner lr to 4e-3)
    stage 7  the same once more (the inner lr at warmup 240 past DP's, DiLoCo's edges; warmup 480 at the best lr),
             and Streaming H = 100 at warmup 120 and 240 by hand (searched at 15-60 only)
    stage 8  the same, with H = 100's inner lr x 1/2, x 2 at its new warmup (120), and its outer settings there
             (0.7 / 0.9 and 1.0 / 0.5) by hand
    stage 9  the same once more (H = 100's inner lr moved to 4e-3 at warmup 120)

    .venv/bin/python studies/outer-tuning/stages.py table            # best per method so far
    .venv/bin/python studies/outer-tuning/stages.py plot             # search.png
    .venv/bin/python studies/outer-tuning/stages.py write stage2     # -> grids s2-* (then run them)
    .venv/bin/python studies/outer-tuning/stages.py write long       # point 4: grids long-*, 20 tokens/param
    .venv/bin/python studies/outer-tuning/stages.py grids s2-        # writes grids/s2-*.json for diloco sweep

Every run is recorded in results-cpu.jsonl by ``diloco sweep`` (resumable; the search's runs are those of the
runs folders runs/outer-tuning/s1- to s9-); this script only reads it and adds grids that do not exist yet to
grids.jsonl (it never rewrites one).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import defaultdict
from pathlib import Path

from diloco.studies.grid_files import append_grids, read_grids, write_grid_files
from diloco.studies.outer_tuning import GRIDS, HERE, method_key, records

OUTER_LRS = (0.5, 0.7, 1.0)
MOMENTA = (0.0, 0.5, 0.9)
WARMUPS = (15, 60)
BRACKET_STAGES = tuple(f"stage{i}" for i in range(4, 10))  # each one step past the edges left (write_bracket)


def settings(rec: dict) -> tuple:
    """The searched settings of a record: (inner lr, outer lr, outer momentum, warmup)."""
    base = rec["base"]
    return (rec["inner_lr"], rec["outer_lr"], base.get("outer_momentum"), base.get("warmup_steps"))


def load() -> dict[str, dict[tuple, float]]:
    """method key -> settings -> eval loss (diverged: inf). A setting run more than once (a later stage's grid
    may hold an earlier stage's best point; compiled bf16 runs are not bit-reproducible) gets the mean."""
    runs: dict[str, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for rec in records("search"):
        loss = rec.get("eval_loss")
        runs[method_key(rec)][settings(rec)].append(math.inf if loss is None else float(loss))
    return {k: {s: sum(v) / len(v) for s, v in by.items()} for k, by in runs.items()}


def repeats() -> list[tuple[str, tuple, list[float]]]:
    """Every setting run more than once, with its losses: the run-to-run noise of the search."""
    runs: dict[tuple, list[float]] = defaultdict(list)
    for rec in records("search"):
        if rec.get("eval_loss") is not None:
            runs[(method_key(rec), settings(rec))].append(rec["eval_loss"])
    return [(k, s, v) for (k, s), v in runs.items() if len(v) > 1]


def best(runs: dict[tuple, float]) -> tuple[tuple, float]:
    s = min(runs, key=runs.get)
    return s, runs[s]


def edges(runs: dict[tuple, float], s: tuple) -> list[str]:
    """The coordinates along which ``s`` is at the edge of what was tried (the others held at ``s``)."""
    names = ("inner lr", "outer lr", "outer momentum", "warmup")
    out = []
    for i, name in enumerate(names):
        tried = sorted({t[i] for t in runs if all(t[j] == s[j] for j in range(4) if j != i) and t[i] is not None})
        if len(tried) > 1 and s[i] in (tried[0], tried[-1]):
            out.append(f"{name} {'low' if s[i] == tried[0] else 'high'} end of {tried}")
        elif len(tried) == 1 and i == 0:
            out.append(f"inner lr tried at {tried[0]:g} only")
    return out


def table(results: dict[str, dict[tuple, float]]) -> None:
    rep = repeats()
    if rep:
        spread = [max(v) - min(v) for _, _, v in rep]
        print(
            f"run-to-run noise: {len(rep)} settings run twice or more, loss spread "
            f"{min(spread):.4f} .. {max(spread):.4f} (mean {sum(spread) / len(spread):.4f}); their mean is used"
        )
    dp = best(results["dp"])[1] if results.get("dp") else None
    print(
        f"{'method':<28} {'runs':>4} {'inner lr':>8} {'outer':>5} {'mom':>4} {'warm':>4} {'eval loss':>9} "
        f"{'vs DP':>7}  at an edge"
    )
    for key in sorted(results, key=lambda k: (k != "dp", k)):
        s, loss = best(results[key])
        rel = f"{100 * (loss / dp - 1):+.2f}%" if dp else "-"
        o = "-" if s[1] is None else f"{s[1]:g}"
        m = "-" if s[2] is None else f"{s[2]:g}"
        print(
            f"{key:<28} {len(results[key]):>4} {s[0]:>8g} {o:>5} {m:>4} {s[3]:>4} {loss:>9.4f} {rel:>7}  "
            f"{'; '.join(edges(results[key], s)) or '-'}"
        )


def _template(key: str) -> dict:
    """The stage-1 grid a method key came from (its base settings and axes)."""
    for name, grid in sorted(read_grids(GRIDS).items()):
        if not name.startswith("s1-"):
            continue
        for m in grid.get("replicas", [1]):
            for h in grid.get("sync_every", [None]):
                rec = {"method": grid["methods"][0], "replicas": m, "sync_every": h, "base": grid["base"]}
                if method_key(rec) == key:
                    return {**grid, "replicas": [m], "sync_every": [h]} if h is not None else grid
    raise SystemExit(f"no stage-1 grid makes {key!r}")


def _write(name: str, grid: dict, written: list[str]) -> None:
    if not append_grids(GRIDS, {name: grid}):
        print(f"kept {name} (exists)")
        return
    written.append(name)


def write_stage2(results: dict[str, dict[tuple, float]]) -> list[str]:
    written: list[str] = []
    for key in sorted(k for k in results if k != "dp"):
        (lr, _, _, warm), _ = best(results[key])
        grid = _template(key)
        for mom in MOMENTA:
            g = {
                **grid,
                "_comment": f"Stage 2: {key}, outer lr x outer momentum {mom:g} at inner lr {lr:g}.",
                "inner_lr": [lr],
                "outer_lr": list(OUTER_LRS),
                "base": {
                    **grid["base"],
                    "outer_momentum": mom,
                    "warmup_steps": warm,
                    "runs_dir": f"runs/outer-tuning/s2-{key}",
                },
            }
            _write(f"s2-{key}-mom{mom:g}", g, written)
    return written


def write_stage3(results: dict[str, dict[tuple, float]]) -> list[str]:
    written: list[str] = []
    for key in sorted(results):
        (lr, outer, mom, warm), _ = best(results[key])
        grid = _template(key)
        base = {**grid["base"], "runs_dir": f"runs/outer-tuning/s3-{key}"}
        axes = {} if key == "dp" else {"outer_lr": [outer]}
        if mom is not None:
            base["outer_momentum"] = mom
        for w in WARMUPS:
            _write(
                f"s3-{key}-warmup{w}",
                {
                    **grid,
                    **axes,
                    "_comment": f"Stage 3: {key}, warmup {w} at the best so far.",
                    "inner_lr": [lr],
                    "base": {**base, "warmup_steps": w},
                },
                written,
            )
        if key != "dp":  # the outer lr bracketed too: one step (x 1.4) past an edge of stage 2's grid
            tried = sorted({t[1] for t in results[key] if t[0] == lr and t[2] == mom and t[3] == warm})
            beyond = (
                []
                if len(tried) < 2
                else [round(outer * 1.4, 3)]
                if outer == tried[-1]
                else [round(outer / 1.4, 3)]
                if outer == tried[0]
                else []
            )
            if beyond:
                _write(
                    f"s3-{key}-outer",
                    {
                        **grid,
                        "_comment": f"Stage 3: {key}, outer lr {beyond[0]:g} (past the "
                        f"edge of stage 2) at the best so far.",
                        "inner_lr": [lr],
                        "outer_lr": beyond,
                        "base": {**base, "warmup_steps": warm},
                    },
                    written,
                )
        lrs = [v for v in (lr / 2, lr * 2) if (v, outer, mom, warm) not in results[key]]
        if lrs:
            _write(
                f"s3-{key}-lr",
                {
                    **grid,
                    **axes,
                    "_comment": f"Stage 3: {key}, inner lr around {lr:g} at the best outer settings.",
                    "inner_lr": lrs,
                    "base": {**base, "warmup_steps": warm},
                },
                written,
            )
    return written


def write_bracket(results: dict[str, dict[tuple, float]], *, stage: str, lone_lr: bool = False) -> list[str]:
    """One step past every edge the best setting sits on (inner lr x2 or /2, outer lr x1.4 or /1.4, warmup x2
    or /2; an outer momentum of 0.9, the papers', is not pushed further), the others held at the best.

    With ``lone_lr`` an inner lr tried at only one value at the best's other settings (so neither bracketed
    nor flagged as an edge) gets both neighbours, x 1/2 and x 2."""
    written: list[str] = []
    for key in sorted(results):
        runs = results[key]
        s, _ = best(runs)
        lr, outer, mom, warm = s
        grid = _template(key)
        for i, name, up, down in ((0, "lr", 2.0, 0.5), (1, "outer", 1.4, 1 / 1.4), (3, "warmup", 2.0, 0.5)):
            if s[i] is None:
                continue
            tried = sorted({t[i] for t in runs if all(t[j] == s[j] for j in range(4) if j != i)})
            if lone_lr and i == 0 and len(tried) == 1:
                factors = (down, up)
            elif len(tried) < 2 or s[i] not in (tried[0], tried[-1]):
                continue
            else:
                factors = (up if s[i] == tried[-1] else down,)
            points = []
            for f in factors:
                value = s[i] * f
                point = list(s)
                point[i] = int(round(value)) if i == 3 else round(value, 6)
                points.append(point)
            base = {**grid["base"], "warmup_steps": points[0][3], "runs_dir": f"runs/outer-tuning/{stage}-{key}"}
            if mom is not None:
                base["outer_momentum"] = mom
            values = ", ".join(f"{p[i]:g}" for p in points)
            why = "tried at one value only" if len(factors) == 2 else f"one step past the edge of {tried}"
            g = {
                **grid,
                "_comment": f"{stage}: {key}, {name} {values} ({why}).",
                "inner_lr": [p[0] for p in points],
                "base": base,
            }
            if key != "dp":
                g["outer_lr"] = [points[0][1]]
            _write(f"{stage}-{key}-{name}", g, written)
    return written


LONG = {  # point 4: method key -> seeds (FP4 against FP32 at two seeds; the rest one)
    "dp": (0,),
    "diloco-m1-h30": (0,),
    "streaming-m2-h30-fp4_e3m0": (0, 1),
    "streaming-m2-h30-fp32": (0, 1),
    "streaming-m2-h100-fp4_e3m0": (0,),
    "diloco-m2-h30": (0,),
    "streaming-m2-h30-fp4_e3m0-paper": (0,),  # the papers' outer 0.7 / Nesterov 0.9 at the best inner lr
    # stage 5 moved DiLoCo's best inner lr at warmup 120 (the long runs' warmup) to DP's, 4e-3: the long runs
    # again at the best of the runs with that warmup
    "diloco-m1-h30-retuned": (0,),
    "diloco-m2-h30-retuned": (0,),
    # stage 7 moved Streaming H = 100's best warmup from 30 (its long run's) to 120, the others' long-run warmup
    "streaming-m2-h100-fp4_e3m0-retuned": (0,),
}
LONG_WARMUP = 120  # the "-retuned" runs take the best inner lr among the search's runs at this warmup


def write_long(results: dict[str, dict[tuple, float]], *, size: str, tokens_per_param: float) -> list[str]:
    """Point 4: each method at its best settings for ``tokens_per_param`` tokens per parameter, evaluated
    every 400 steps (the eval-loss-vs-tokens curves). FP32 Streaming takes FP4's settings; ``-paper``
    takes the papers' outer lr 0.7 and Nesterov momentum 0.9 instead of the search's; ``-retuned`` takes the
    best inner lr among the search's runs at the long runs' warmup, ``LONG_WARMUP`` (written once: an existing
    grid is never rewritten)."""
    written: list[str] = []
    for key, seeds in LONG.items():
        src = key.replace("-fp32", "-fp4_e3m0").removesuffix("-paper").removesuffix("-retuned")
        if not results.get(src):
            print(f"skipped {key}: no search results for {src}")
            continue
        runs = results[src]
        if key.endswith("-retuned"):
            runs = {k: v for k, v in runs.items() if k[3] == LONG_WARMUP}
        (lr, outer, mom, warm), _ = best(runs)
        if key.endswith("-paper"):
            outer, mom = 0.7, 0.9
        grid = _template(src)
        base = {**grid["base"], "warmup_steps": warm, "eval_every": 400, "runs_dir": f"runs/outer-tuning/long-{size}"}
        if mom is not None:
            base["outer_momentum"] = mom
        if key.endswith("-fp32"):
            base["codec"] = "fp32"
        axes = {} if key == "dp" else {"outer_lr": [outer]}
        for seed in seeds:
            comment = (
                f"Point 4: {key} at its best search settings (inner lr {lr:g}, warmup {warm}), "
                f"{tokens_per_param:g} tokens per parameter, seed {seed}."
            )
            g = {
                **grid,
                **axes,
                "_comment": comment,
                "sizes": [size],
                "inner_lr": [lr],
                "tokens_per_param": tokens_per_param,
                "seed": seed,
                "base": base,
            }
            _write(f"long-{size}-{key}-seed{seed}", g, written)
    return written


def markdown(results: dict[str, dict[tuple, float]]) -> None:
    """The README / docs table: each method's best settings, and the best loss at each outer momentum."""
    dp = best(results["dp"])[1] if results.get("dp") else None
    print(
        "| method | runs | inner lr | outer lr / momentum | warmup | eval loss | vs DP | stage 2 (warmup 30): best at "
        "momentum 0 / 0.5 / 0.9 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(results, key=lambda k: (k != "dp", k)):
        runs = results[key]
        (lr, outer, mom, warm), loss = best(runs)
        by_mom = []
        for m in MOMENTA:
            vals = [v for t, v in runs.items() if t[2] == m and t[3] == 30]
            by_mom.append(f"{min(vals):.3f}" if vals else "–")
        o = "–" if outer is None else f"{outer:g} / {mom:g}"
        rel = f"{100 * (loss / dp - 1):+.2f} %" if dp else "–"
        print(
            f"| {key} | {len(runs)} | {lr:g} | {o} | {warm} | {loss:.4f} | {rel} | "
            f"{'–' if key == 'dp' else ' / '.join(by_mom)} |"
        )


def plot(results: dict[str, dict[tuple, float]], path: Path) -> None:
    """One panel per method: eval loss against outer lr, one line per outer momentum (at that method's best
    inner lr and warmup), and against inner lr for DP; DP's best as a dashed line everywhere."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(results, key=lambda k: (k != "dp", k))
    dp = best(results["dp"])[1] if results.get("dp") else None
    cols = 3
    rows = -(-len(keys) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.4 * rows), squeeze=False, sharey=True)
    for ax in axes.flat[len(keys) :]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys, strict=False):
        runs = results[key]
        (lr, _, _, warm), _ = best(runs)
        if key == "dp":
            pts = sorted((s[0], v) for s, v in runs.items() if s[3] == warm and math.isfinite(v))
            ax.plot(*zip(*pts, strict=True), marker="o")
            ax.set(xscale="log", xlabel="inner lr")
            ax.set_xticks([p for p, _ in pts], [f"{p:g}" for p, _ in pts], minor=False)
            ax.minorticks_off()
        else:
            for mom in sorted({s[2] for s in runs}):
                pts = sorted(
                    (s[1], v)
                    for s, v in runs.items()
                    if s[0] == lr and s[2] == mom and s[3] == warm and math.isfinite(v)
                )
                if pts:
                    ax.plot(*zip(*pts, strict=True), marker="o", label=f"momentum {mom:g}")
            ax.set(xlabel=f"outer lr (inner lr {lr:g})")
            ax.legend(fontsize=7)
        if dp is not None:
            ax.axhline(dp, color="k", ls="--", lw=0.8)
        ax.set_title(key, fontsize=8)
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("eval loss, 1 token/param\n(dashed: DP's best)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("table")
    sub.add_parser("markdown", help="the table for the docs")
    sub.add_parser("plot", help="search.png: eval loss against the outer settings, per method")
    w = sub.add_parser("write")
    w.add_argument("stage", choices=("stage2", "stage3", *BRACKET_STAGES, "long"))
    w.add_argument("--size", default="cpu-1m", help="long: the model size")
    w.add_argument("--tokens-per-param", type=float, default=20.0, help="long: tokens per parameter")
    g = sub.add_parser("grids", help="write grids/NAME.json (for diloco sweep --grid) of the grids named PREFIX*")
    g.add_argument("prefix", nargs="?", default="")
    args = ap.parse_args(argv)
    if args.cmd == "grids":
        names = [n for n in read_grids(GRIDS) if n.startswith(args.prefix)]
        for path in write_grid_files(GRIDS, HERE / "grids", names):
            print(path.relative_to(HERE.parents[1]))
        return 0
    results = load()
    if args.cmd == "table":
        table(results)
        return 0
    if args.cmd == "markdown":
        markdown(results)
        return 0
    if args.cmd == "plot":
        plot(results, HERE / "search.png")
        print(f"wrote {HERE / 'search.png'}")
        return 0
    if args.stage == "long":
        written = write_long(results, size=args.size, tokens_per_param=args.tokens_per_param)
    elif args.stage in BRACKET_STAGES:
        written = write_bracket(results, stage="s" + args.stage[-1], lone_lr=args.stage != "stage4")
    else:
        written = (write_stage2 if args.stage == "stage2" else write_stage3)(results)
    print(" ".join(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
