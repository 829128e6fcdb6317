"""Compare this tree's codecs with those of an earlier commit: same payloads, and how much faster.

Loads ``src/diloco/algorithm/codecs.py`` as it was at ``--baseline`` (via ``git show``; the codecs' one
file before they moved to :mod:`diloco.wire`, so the baseline is a commit from before that) next to
the current ones, then, in one run:

1. checks that both encoders produce byte-identical payloads and both decoders identical values
   on a set of inputs (Gaussian, heavy-tailed over 78 decades, many exact ties, zero blocks,
   ragged tails, huge values), for every codec both versions know; for inputs holding NaN or inf,
   where only "decodes to all NaN" is defined, that each version's payload does so in both;
2. times encode and decode of ``--numel`` values (default 2,033,344: the ``cpu-1m`` demo model,
   one outer gradient) with the two versions interleaved, and prints the ratio.

    .venv/bin/python benchmarks/codec_versions.py --baseline a6c008f    # ~1 minute

Prints a table and writes benchmarks/results/codec_versions.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from diloco.bench import time_rounds, write_result
from diloco.wire import registry as current

ROOT = Path(__file__).resolve().parents[1]


def load_baseline(rev: str):
    shown = subprocess.run(
        ["git", "show", f"{rev}:src/diloco/algorithm/codecs.py"], cwd=ROOT, capture_output=True, text=True
    )
    if shown.returncode != 0:
        sys.exit(
            f"--baseline {rev!r}: git has no src/diloco/algorithm/codecs.py at that revision "
            f"({shown.stderr.strip()}); pass a commit of this repository, e.g. a6c008f"
        )
    source = shown.stdout
    # a baseline from before diloco.wire imports the byte counts from their old path: serve it the current ones
    sys.modules.setdefault("diloco.algorithm.wire_sizes", importlib.import_module("diloco.wire.sizes"))
    path = Path(tempfile.mkdtemp()) / "baseline_codecs.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_codecs", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_codecs"] = module
    spec.loader.exec_module(module)
    return module


def inputs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for trial in range(48):
        n = int(torch.randint(1, 40_000, (1,), generator=g))
        x = torch.randn(n, generator=g)
        kind = trial % 8
        if kind == 1:
            x = x * 10.0 ** torch.randint(-40, 38, (n,), generator=g).float()
        elif kind == 2:
            x = x**3 * 1e-3
        elif kind == 3:
            x[: n // 2] = 0.0
        elif kind == 4:
            x = x * 1e30
        elif kind == 5:
            x = torch.randint(-64, 64, (n,), generator=g).float() / 8  # many exact ties
        elif kind == 6:
            x[int(torch.randint(0, n, (1,), generator=g))] = [float("nan"), float("inf")][trial % 2]
        elif kind == 7:
            x = x.double() * 1e200
        out.append(x)
    return out


def timed_pair(f_old, f_new, repeats: int) -> tuple[float, float]:
    t = time_rounds({"old": f_old, "new": f_new}, repeats=repeats, warmup=1)  # interleaved: noise hits both alike
    return t["old"].median, t["new"].median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision whose codecs.py to compare against")
    ap.add_argument("--numel", type=int, default=2_033_344)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "codec_versions.json")
    args = ap.parse_args()
    torch.set_num_threads(2)
    base = load_baseline(args.baseline)
    names = [n for n in current.CODEC_NAMES if n in base.CODEC_NAMES]

    mismatches = []
    data = inputs()
    for name in names:
        old, new = base.get_codec(name), current.get_codec(name)
        for i, x in enumerate(data):
            p_old, p_new = old.encode(x), new.encode(x)
            if not bool(torch.isfinite(x).all()):  # only "decodes to all NaN" is defined; the codes are not
                if not (
                    old.decode(p_new, x.numel()).isnan().all()
                    and new.decode(p_new, x.numel()).isnan().all()
                    and new.decode(p_old, x.numel()).isnan().all()
                ):
                    mismatches.append(f"{name}: non-finite input {i} does not decode to all NaN")
                continue
            if not torch.equal(p_old, p_new):
                mismatches.append(f"{name}: encode differs on input {i}")
                continue
            d_old, d_new = old.decode(p_old, x.numel()), new.decode(p_old, x.numel())
            if not torch.equal(d_old.nan_to_num(1.0), d_new.nan_to_num(1.0)) or not torch.equal(
                d_old.isnan(), d_new.isnan()
            ):
                mismatches.append(f"{name}: decode differs on input {i}")
    print(
        f"{len(names)} codecs x {len(data)} inputs: "
        + ("payloads and decoded values identical" if not mismatches else f"{len(mismatches)} MISMATCHES")
    )
    for m in mismatches:
        print("  ", m)

    x = torch.randn(args.numel, generator=torch.Generator().manual_seed(1)) * 1e-3
    rows = []
    for name in names:
        old, new = base.get_codec(name), current.get_codec(name)
        payload = new.encode(x)
        enc = timed_pair(lambda: old.encode(x), lambda: new.encode(x), args.repeats)
        dec = timed_pair(lambda: old.decode(payload, args.numel), lambda: new.decode(payload, args.numel), args.repeats)
        rows.append(
            {
                "codec": name,
                "encode_ms": {"baseline": 1e3 * enc[0], "current": 1e3 * enc[1]},
                "decode_ms": {"baseline": 1e3 * dec[0], "current": 1e3 * dec[1]},
                "encode_speedup": enc[0] / enc[1],
                "decode_speedup": dec[0] / dec[1],
            }
        )
    print(
        f"\n{args.numel:,} values, median of {args.repeats} interleaved repeats, torch threads 2; "
        f"baseline {args.baseline}"
    )
    print(f"{'codec':<10} {'encode ms (base -> now)':>24} {'x':>6} {'decode ms (base -> now)':>24} {'x':>6}")
    for r in rows:
        e, d = r["encode_ms"], r["decode_ms"]
        print(
            f"{r['codec']:<10} {e['baseline']:>11.1f} -> {e['current']:>8.1f} {r['encode_speedup']:>6.2f} "
            f"{d['baseline']:>11.1f} -> {d['current']:>8.1f} {r['decode_speedup']:>6.2f}"
        )
    write_result(
        "codec_versions",
        {
            "baseline": args.baseline,
            "numel": args.numel,
            "repeats": args.repeats,
            "identical": not mismatches,
            "mismatches": mismatches,
            "rows": rows,
        },
        out=args.out,
    )
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
