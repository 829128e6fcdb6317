"""How long `diloco` takes to answer, in a fresh interpreter each time, and whether it loads torch.

    .venv/bin/python benchmarks/cli_start.py          # ~30 s

Times (median of --repeats) of `diloco --help`, `diloco simulate` (one model, three bandwidths) and
`diloco plan` (10B, two sites, three bandwidths; with and without the plot, which imports
matplotlib), each as a new process; and `import diloco.sim`. Checks that none of them imports torch.
Writes benchmarks/results/cli_start.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from diloco.bench import time_it, write_result

PROBE = (
    "import sys, runpy; sys.argv = ['diloco', *sys.argv[1:]]\n"
    "try:\n    runpy.run_module('diloco', run_name='__main__')\nexcept SystemExit:\n    pass\n"
    "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
)


def timed(argv: list[str], repeats: int) -> dict:
    torch = set()

    def once() -> None:
        proc = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise SystemExit(f"{argv} failed: {proc.stderr[-500:]}")
        torch.add(proc.stdout.strip().splitlines()[-1])

    t = time_it(once, repeats=repeats)
    return {"argv": argv, "median_s": t.median, "min_s": t.min, "max_s": t.max, "imports_torch": "TORCH" in torch}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "cli_start.json")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="cli-start-"))
    plan = ["plan", "--size", "10B", "--workers", "2", "--tokens-per-step", "4e6", "--bandwidth", "10", "1", "0.1"]
    cases = {
        "python -c pass": None,
        "diloco --help": ["--help"],
        "diloco simulate (10B, 3 bandwidths)": [
            "simulate",
            "--size",
            "10B",
            "--bandwidth",
            "10",
            "1",
            "0.1",
            "--no-plot",
            "--out",
            str(tmp / "sim"),
        ],
        "diloco plan (10B, 3 bandwidths, no plot)": [*plan, "--no-plot", "--out", str(tmp / "plan")],
        "diloco plan (10B, 3 bandwidths, with plot)": [*plan, "--out", str(tmp / "plan2")],
    }
    results = {}
    for name, argv in cases.items():
        if argv is None:
            t = time_it(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), repeats=args.repeats)
            results[name] = {"median_s": t.median, "imports_torch": False}
        else:
            results[name] = timed(argv, args.repeats)
        r = results[name]
        print(f"{name:<44} {r['median_s']:6.2f} s   torch imported: {r['imports_torch']}")
    write_result(
        "cli_start", {"repeats": args.repeats, "python": sys.version.split()[0], "results": results}, out=args.out
    )


if __name__ == "__main__":
    main()
