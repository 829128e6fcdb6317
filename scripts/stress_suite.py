"""Run the test suite as other machines would: under a CPU hog, with the codecs' C loops built for narrower CPUs,
and with them off; print one line per run and write them as JSON.

    make stress                                           # every mode below, one after another (~40 min)
    .venv/bin/python scripts/stress_suite.py --modes hog off
    .venv/bin/python scripts/stress_suite.py --modes plain plain plain   # three runs in a row
    .venv/bin/python scripts/stress_suite.py --modes x86-64-v3 -- tests/unit -x   # pytest arguments after --

Modes (each a full ``pytest`` run, as ``make test`` runs it, tcmalloc preloaded where installed):

- ``plain``: nothing changed (what ``make test`` does);
- ``hog``: a busy loop on one core beside the suite for its whole run (another user's job on a shared machine);
- ``x86-64-v3`` / ``x86-64``: the codecs' C loops built for AVX2 / SSE2 (``DILOCO_NATIVE_MARCH``), the vector
  widths of CPUs without AVX-512, each into a kernel cache of its own (checked to build before the run);
- ``off``: the codecs' torch code (``DILOCO_NATIVE_CODECS=0``), a machine without a C compiler.

The suite must pass in every mode: a test that fails in one of them depends on the machine. Each run's output is
kept in ``--logs`` (default ``runs/stress-suite``), the table in ``--logs``/stress-suite.json. Exit status 1 if
any run failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("plain", "hog", "x86-64-v3", "x86-64", "off")
_SUMMARY = re.compile(r"^=*\s*(?P<body>\d+ (?:passed|failed).*) in (?P<secs>[\d.]+)s")  # -q drops the ='s


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return platform.processor()


def mode_env(mode: str, cache_root: Path) -> dict[str, str]:
    """The environment of one mode's run (this process' own, plus the mode's settings)."""
    env = dict(os.environ)
    tcmalloc = sorted(glob.glob("/usr/lib/*/libtcmalloc_minimal.so.4"))
    if tcmalloc:
        env["LD_PRELOAD"] = tcmalloc[0]
    if mode in ("x86-64-v3", "x86-64"):
        env["DILOCO_NATIVE_MARCH"] = mode
        env["DILOCO_KERNEL_CACHE"] = str(cache_root / mode)
    elif mode == "off":
        env["DILOCO_NATIVE_CODECS"] = "0"
    return env


def check_build(env: dict[str, str]) -> None:
    """The C loops build and load for the mode's ``-march`` (a silent fall-back to torch would test the wrong code)."""
    probe = "from diloco.wire import native; import sys; sys.exit(0 if native.library() is not None else 1)"
    if subprocess.run([sys.executable, "-c", probe], env=env, cwd=ROOT).returncode != 0:
        raise SystemExit(f"the C loops did not build for -march={env['DILOCO_NATIVE_MARCH']}: see the warning above")


def minutes(seconds: float) -> str:
    """``111.9`` -> ``"1 min 52 s"`` (whole seconds)."""
    m, s = divmod(round(seconds), 60)
    return f"{m} min {s:02d} s"


def parse_summary(text: str) -> dict[str, object]:
    """pytest's closing line: counts by outcome and its seconds (empty if the run ended without one)."""
    for line in reversed(text.splitlines()):
        m = _SUMMARY.match(line.strip())
        if m:
            counts = {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", m["body"])}
            return {"counts": counts, "test_s": float(m["secs"])}
    return {}


def run_mode(mode: str, pytest_args: list[str], logs: Path, cache_root: Path, nth: int = 1) -> dict[str, object]:
    env = mode_env(mode, cache_root)
    if "DILOCO_NATIVE_MARCH" in env:
        check_build(env)
    hog = None
    if mode == "hog":  # one busy core for the run's length, stopped by its pid below
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    log = logs / (f"{mode}.log" if nth == 1 else f"{mode}-{nth}.log")  # a mode given twice: a log each
    began = time.monotonic()
    try:
        with open(log, "w") as f:
            rc = subprocess.run(
                [sys.executable, "-m", "pytest", *pytest_args], env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT
            ).returncode
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    text = log.read_text(errors="replace")
    failed = [
        line.split(" ", 1)[1].split(" - ")[0] for line in text.splitlines() if line.startswith(("FAILED ", "ERROR "))
    ]
    return {
        "mode": mode,
        "rc": rc,
        "wall_s": round(time.monotonic() - began, 1),
        **parse_summary(text),
        "failed": failed,
    }


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="which runs (default: all)")
    ap.add_argument("--logs", type=Path, default=ROOT / "runs" / "stress-suite", help="each run's output and the table")
    args = ap.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    machine = {"cpu": cpu_model(), "cores": os.cpu_count(), "load_before": os.getloadavg()}
    print(f"{machine['cpu']}, {machine['cores']} cores; logs in {args.logs}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="stress-kernels-") as cache_root:
        for i, mode in enumerate(args.modes):
            row = run_mode(mode, pytest_args, args.logs, Path(cache_root), nth=args.modes[: i + 1].count(mode))
            rows.append(row)
            counts = ", ".join(f"{n} {k}" for k, n in row.get("counts", {}).items()) or "no summary line"
            test_s = row.get("test_s")
            took = f"{minutes(test_s)} of tests" if test_s is not None else "?"
            print(f"{mode:>10}: rc {row['rc']}, {counts}, {took}, {row['wall_s']:.0f} s wall", flush=True)
            for name in row["failed"]:
                print(f"{'':>12}FAILED {name}", flush=True)
            out = {"machine": machine, "pytest_args": pytest_args, "runs": rows}
            (args.logs / "stress-suite.json").write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")
    return 0 if all(r["rc"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
