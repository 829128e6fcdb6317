"""The syncer as a service (``diloco syncer``) and the learners' handshake with it, on a real local Ray instance
(token authentication as Ray's environment sets it). Skipped when Ray is not installed."""

from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")

from diloco.cli._common import load_preset  # noqa: E402
from diloco.cli.syncer import service_config  # noqa: E402
from diloco.decoupled.service import (  # noqa: E402
    connect_learner,
    describe_differences,
    fingerprint,
    learner_command,
    parse_syncer,
    plan_out,
)
from diloco.errors import ConfigError  # noqa: E402

SRC = Path(__file__).resolve().parents[2] / "src"
SETS = {"replicas": 2, "num_fragments": 2, "sync_every": 4, "overlap_steps": 1}


def _cfg(**extra):
    return service_config(load_preset("tiny"), {**SETS, **extra})


# -- without a syncer --------------------------------------------------------
def test_the_fingerprint_names_each_differing_key_with_both_values():
    mine = fingerprint(_cfg(sync_every=8, outer_lr=0.5), vocab_size=512, data_digest="a")
    theirs = fingerprint(_cfg(), vocab_size=512, data_digest="b")
    text = describe_differences(syncer=theirs, learner=mine)
    assert "sync_every: the learner has 8, the syncer 4" in text
    assert "outer_lr: the learner has 0.5, the syncer 0.7" in text
    assert "data_digest: the learner has 'a', the syncer 'b'" in text
    assert "replicas" not in text and "seq_len" not in text
    # a learner that does not give its data is compared on the config alone; a learner-only setting changes nothing
    same = fingerprint(_cfg(steps=7, inner_lr=1e-2))
    assert describe_differences(syncer=theirs, learner=same) == ""


def test_parse_syncer_and_the_learner_command():
    assert parse_syncer("diloco-syncer-ab@127.0.0.1:6379") == ("diloco-syncer-ab", "127.0.0.1:6379")
    with pytest.raises(ConfigError, match="NAME@ADDRESS"):
        parse_syncer("127.0.0.1:6379")
    line = learner_command(
        preset="tiny",
        overrides=["replicas=2", "ray_address=10.0.0.1:6379", "sync_every=4"],
        ranks=2,
        learner=1,
        syncer="s@10.0.0.1:6379",
        out="site-1",
    )
    assert line == (
        "torchrun --nproc-per-node 2 -m diloco train --preset tiny --method decoupled --set replicas=2 "
        "--set sync_every=4 --set learner=1 --set syncer=s@10.0.0.1:6379 --out site-1"
    )


def test_an_out_folder_holding_other_files_is_refused_and_left_as_it_was(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="no `diloco syncer` run"):
        plan_out(tmp_path, _cfg())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    (tmp_path / "config.json").write_text(json.dumps(_cfg(sync_every=8).to_dict()))
    (tmp_path / "syncer.json").write_text("{}")
    with pytest.raises(ConfigError, match="sync_every: 8 there, 4 now"):
        plan_out(tmp_path, _cfg())
    assert plan_out(tmp_path / "new", _cfg()) is None
    (tmp_path / "config.json").write_text(json.dumps(_cfg().to_dict()))  # the same config: resumed
    (tmp_path / "syncer.json").write_text(json.dumps({"name": "diloco-syncer-x"}))
    assert plan_out(tmp_path, _cfg()) == {"name": "diloco-syncer-x"}


def test_ray_not_installed_is_a_config_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install -e \.\[ray\]"):
        connect_learner(_cfg(), learner=0, syncer="s@127.0.0.1:1")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_an_address_where_a_web_server_or_nothing_answers_is_refused_within_5_s():
    from diloco.decoupled.ray_transport import check_address

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        start = time.monotonic()
        with pytest.raises(ConfigError, match=rf"ray_address='127.0.0.1:{port}' is not a Ray cluster.*it answered"):
            check_address(f"127.0.0.1:{port}")
        assert time.monotonic() - start < 5.0
        if not ray.is_initialized():  # the learner's way in: the same probe before ray.init
            start = time.monotonic()
            with pytest.raises(ConfigError, match=f"127.0.0.1:{port}"):
                connect_learner(_cfg(), learner=0, syncer=f"s@127.0.0.1:{port}")
            assert time.monotonic() - start < 5.0
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        free = sock.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(ConfigError, match=f"127.0.0.1:{free}' does not answer"):
        check_address(f"127.0.0.1:{free}")
    assert time.monotonic() - start < 5.0


# -- the service -------------------------------------------------------------
def _train(cfg, info, m, steps, *, errors, finished, then=None):
    """Learner ``m``: the tiny model on random tokens, through connect_learner, ``steps`` steps (with ``then``, an
    event: ``steps`` more steps once it is set), then finish."""
    from diloco.decoupled.learner import Learner
    from diloco.models.factory import build_model
    from diloco.train.inputs import run_fragments

    try:
        fp = info["fingerprint"]
        vocab = fp["data_vocab_size"]
        model = build_model(cfg.model, size=cfg.size, vocab_size=vocab, seq_len=cfg.seq_len, seed=50 + m)
        channel = connect_learner(
            cfg, learner=m, syncer=info["syncer"], vocab_size=vocab, data_digest=fp["data_digest"]
        )
        algo = Learner(
            model,
            channel=channel,
            learner=m,
            sync_every=cfg.sync_every,
            num_fragments=cfg.num_fragments,
            fragment_pattern=cfg.fragment_pattern,
            fragments=run_fragments(cfg, model),
            overlap_steps=cfg.overlap_steps,
            codec=cfg.make_codec(),
            tokens_per_step=4 * cfg.seq_len,
        )
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        gen = torch.Generator().manual_seed(m)
        left = steps
        while left > 0:
            x = torch.randint(0, vocab, (4, cfg.seq_len + 1), generator=gen)
            model(x[:, :-1], x[:, 1:])[1].backward()
            opt.step()
            opt.zero_grad()
            algo.after_optimizer_step(tokens=x[:, 1:].numel())
            time.sleep(0.1)  # a site's step
            if then is None or then.is_set():  # learner 1 outlives the checks below, then merges alone
                left -= 1
        algo.finish()
        finished.append((m, time.time()))
    except BaseException as exc:
        errors.append((m, exc))


def _wait_for(what, check, *, timeout, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the service exited ({proc.returncode}) while waiting for {what}:\n{proc.stdout.read()}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


@pytest.mark.slow  # ~25 s on 2 cores: a Ray instance in a subprocess and a learner of ~15 s
@pytest.mark.timeout(300)
def test_the_service_runs_two_learners_refuses_intruders_and_exports(tmp_path, token_cache, monkeypatch):
    """`diloco syncer` in a subprocess; two learners (threads here, each with its own session) join it by
    NAME@ADDRESS; a learner of another config, an index out of range, a second claim on a live index and a
    finished learner's return are refused; the service exits 0 once both finished, and `diloco export` reads its
    folder. (The service's syncer SIGKILLed mid-run and restarted from its checkpoint, with learners that are
    processes: tests/integration/test_site_faults.py.)"""
    out = tmp_path / "svc"
    cmd = [sys.executable, "-m", "diloco", "syncer", "--preset", "tiny"]
    for k, v in SETS.items():
        cmd += ["--set", f"{k}={v}"]
    cmd += ["--out", str(out), "--cache-dir", str(token_cache), "--poll", "0.5"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    checked = threading.Event()  # learner 1 trains on until the checks below are done, then 8 steps (4 reports)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        info = _wait_for("syncer.json", lambda: (out / "syncer.json").is_file(), timeout=120, proc=proc)
        info = json.loads((out / "syncer.json").read_text())
        name, address = parse_syncer(info["syncer"])
        assert address == info["address"] and info["learners"][1].endswith(
            f"--set learner=1 --set syncer={info['syncer']} --out svc-learner-1"
        )
        from diloco.decoupled.ray_transport import init

        if info["ray"]["auth_mode"] == "token":  # a site's learners run with RAY_AUTH_MODE=token (the command says
            assert info["learners"][0].startswith("RAY_AUTH_MODE=token ")  # so); Ray read the environment at import:
            monkeypatch.setenv("RAY_AUTH_MODE", "token")  # set it, and have Ray read it again, as Ray itself does
            ray._raylet.Config.initialize("")
        init(address=address, namespace=info["namespace"])  # as a learner joins: probed first, with the token
        assert ray.is_initialized()
        actor = _wait_for("the actor", lambda: _actor(name, info["namespace"]), timeout=60, proc=proc)
        cfg = _cfg()
        errors: list = []
        finished: list = []
        threads = [
            threading.Thread(
                target=_train, args=(cfg, info, m, steps), kwargs=dict(errors=errors, finished=finished, then=then)
            )
            for m, steps, then in ((0, 40, None), (1, 8, checked))
        ]
        for th in threads:
            th.start()
        _wait_for("both learners live", lambda: len(ray.get(actor.status.remote())["live"]) == 2, timeout=60)

        with pytest.raises(ConfigError, match=r"sync_every: the learner has 8, the syncer 4.*outer_lr"):
            connect_learner(_cfg(sync_every=8, outer_lr=0.5), learner=0, syncer=info["syncer"])
        with pytest.raises(ConfigError, match=r"learner=2 is out of range.*0\.\.1"):
            connect_learner(cfg, learner=2, syncer=info["syncer"])
        start = time.monotonic()
        with pytest.raises(ConfigError, match="learner 1 is taken"):  # learner 1 runs on: its claim never lapses
            connect_learner(cfg, learner=1, syncer=info["syncer"])
        assert 4.0 <= time.monotonic() - start < 15.0  # it waited the lease out first

        _wait_for("two merges", lambda: ray.get(actor.status.remote())["merges"] >= 2, timeout=60)

        _wait_for("learner 0 to finish", lambda: any(m == 0 for m, _ in finished) or errors, timeout=120)
        assert not errors, errors
        with pytest.raises(ConfigError, match="learner 0 has finished"):
            connect_learner(cfg, learner=0, syncer=info["syncer"])
        checked.set()
        for th in threads:
            th.join(timeout=180)
        assert not errors, errors
        ray.shutdown()
        output, _ = proc.communicate(timeout=120)
    finally:
        checked.set()  # (a check that failed ends learner 1 too)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        ray.shutdown()
    assert proc.returncode == 0, output
    assert "every learner finished" in output and "the syncer restarted" not in output

    merges = [json.loads(line) for line in (out / "merges.jsonl").read_text().splitlines()]
    for p in (0, 1):  # every version of each fragment once, in order
        assert [r["version"] for r in merges if r["fragment"] == p] == list(
            range(1, 1 + sum(r["fragment"] == p for r in merges))
        )
    assert {m for r in merges for m in r["learners"]} == {0, 1}
    assert merges[-1]["learners"] == [1]  # after learner 0 finished, learner 1 merges alone (no quorum of 2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["syncer_restarts"] == 0 and summary["merges"] == len(merges)
    states = sorted((out / "syncer").glob("syncer-*.pt"))
    assert states and (out / "syncer" / "records.jsonl").is_file()
    events = [json.loads(line)["event"] for line in (out / "syncer" / "events.jsonl").read_text().splitlines()]
    assert events.count("started") == 1

    from diloco.cli import main
    from diloco.models.saving import load_transformer

    assert main(["export", str(out), "--out", str(tmp_path / "model")]) == 0
    model = load_transformer(tmp_path / "model")
    final = torch.load(states[-1], map_location="cpu", weights_only=True)["syncer"]["global"]  # the actor's own
    from diloco.algorithm.fragments import flatten, split_fragments
    from diloco.train.inputs import run_fragments

    cfg = _cfg()
    frags = split_fragments(model, cfg.num_fragments, pattern=cfg.fragment_pattern, fragments=run_fragments(cfg, model))
    for frag, flat in zip(frags, final, strict=True):
        assert torch.equal(flatten(frag.params), flat)


def _actor(name, namespace):
    try:
        return ray.get_actor(name, namespace=namespace)
    except ValueError:
        return None
