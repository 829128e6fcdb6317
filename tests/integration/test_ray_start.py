"""Ray's start-up timeouts on a busy machine are retried, and what a failed start left is ended
(:mod:`diloco.decoupled.ray_start`).

Ray's own timeouts are real here: ``RAY_gcs_server_port_wait_time_s=0`` makes the GCS port wait time out at once
(what 2 busy cores do within Ray's 30 s). One process (Ray's global state is per process): first every attempt
times out, then a start whose first attempt times out and whose second is given the time."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("ray")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import ray
    from diloco.decoupled.ray_start import descendants, start_ray, _is_ray

    out = {}
    os.environ["RAY_gcs_server_port_wait_time_s"] = "0"  # every attempt times out
    try:
        start_ray(None, attempts=2, num_cpus=1, include_dashboard=False, log_to_driver=False)
        out["failed"] = None
    except RuntimeError as exc:
        out["failed"] = str(exc)
    out["left_after_failure"] = sorted(p for p in descendants(os.getpid()) if _is_ray(p))

    real, waits = ray.init, []

    def init(*args, **kwargs):  # the first attempt times out for real, the second is given Ray's time
        os.environ["RAY_gcs_server_port_wait_time_s"] = "0" if not waits else "120"
        waits.append(os.environ["RAY_gcs_server_port_wait_time_s"])
        return real(*args, **kwargs)

    ray.init = init
    start_ray(None, num_cpus=1, include_dashboard=False, log_to_driver=False)
    out["attempts"] = waits
    out["answer"] = ray.get(ray.remote(lambda: 41 + 1).remote())
    ray.shutdown()
    print(json.dumps(out))
    """
)


@pytest.mark.timeout(240)
def test_a_start_that_times_out_is_cleaned_up_and_tried_again():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["failed"] is not None and "timed out 2 times" in got["failed"], got
    assert "attempt 2 of 2" in proc.stderr  # said on stderr before the second attempt
    assert got["left_after_failure"] == []  # the GCS each failed attempt started was ended
    assert got["attempts"] == ["0", "120"] and got["answer"] == 42
    assert "attempt 2 of 3" in proc.stderr
