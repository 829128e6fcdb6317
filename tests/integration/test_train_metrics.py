"""The synchronous trainer's per-step figures in Prometheus' format (``--set metrics_port=0``,
:mod:`diloco.train.prometheus`): a real ``diloco train`` (DiLoCo, 2 replicas) in a subprocess is scraped while it
trains; the scrape parses with prometheus-client's parser and holds the step rows' figures, the same values the
run's metrics.jsonl holds for that step. A scrape without the token is refused; a bad port is a config error."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("aiohttp")

from diloco.cli._common import load_preset, resolve
from diloco.errors import ConfigError


def _get(url: str, token: str | None) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_a_bad_metrics_port_is_a_config_error():
    for bad in (-2, 65536):
        with pytest.raises(ConfigError, match=rf"metrics_port={bad}: give a port 1..65535, 0 for a free one, or -1"):
            resolve(load_preset("tiny"), "diloco", {"metrics_port": bad})


@pytest.mark.timeout(300)
def test_the_trainer_serves_its_step_figures_while_it_trains(tmp_path, token_cache, monkeypatch):
    from prometheus_client.parser import text_string_to_metric_families

    out = tmp_path / "run"
    args = [sys.executable, "-m", "diloco", "train", "--preset", "tiny", "--method", "diloco", "--no-progress"]
    args += ["--set", "replicas=2", "--set", "steps=30", "--set", "step_time=0.1", "--set", "metrics_port=0"]
    args += ["--set", "threads=1", "--cache-dir", str(token_cache), "--out", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in proc.stderr:
            found = re.search(r"metrics \(Prometheus\): http://[^:]+:(\d+)/metrics", line)
            if found:
                url = f"http://127.0.0.1:{found.group(1)}/metrics"
                break
        assert url is not None, proc.communicate(timeout=60)
        token = (out / "status-token").read_text().strip()
        assert _get(url, None)[0] == 401 and _get(url, "not-it")[0] == 401
        end, families = time.monotonic() + 120, {}
        while "diloco_train_loss" not in families:
            assert time.monotonic() < end and proc.poll() is None, "no step row was served while the run trained"
            status, text = _get(url, token)
            assert status == 200
            families = {f.name: f for f in text_string_to_metric_families(text)}
            time.sleep(0.3)
        step = int(families["diloco_train_step"].samples[0].value)
        loss = families["diloco_train_loss"].samples[0].value
        assert {"diloco_train_tokens", "diloco_train_step_time_s", "diloco_train_lr"} <= set(families)
        proc.communicate(timeout=240)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = next(r for r in rows if r.get("step") == step and "loss" in r)
    assert loss == pytest.approx(logged["loss"], rel=1e-12)  # the served figure is the logged one
