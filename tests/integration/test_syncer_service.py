"""The syncer as a service (``diloco syncer``) and the learners' handshake with it, without a running service: the
config fingerprint, the learner's command, the out folder, a missing Ray, an address that is no Ray cluster.
The service itself, with learners that are site jobs (refusals on the live run, a syncer restart, the export of
its folder): test_site_faults.py. Skipped when Ray is not installed."""

from __future__ import annotations

import contextlib
import http.server
import json
import socket
import sys
import threading
import time

import pytest

ray = pytest.importorskip("ray")

from diloco.cli._common import load_preset  # noqa: E402
from diloco.cli.syncer import service_config  # noqa: E402
from diloco.decoupled.rpc.probe import PROBE_TIMEOUT_S, check_syncer  # noqa: E402
from diloco.decoupled.service import (  # noqa: E402
    connect_learner,
    describe_differences,
    fingerprint,
    learner_command,
    parse_syncer,
    plan_out,
)
from diloco.errors import ConfigError  # noqa: E402

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
        syncer="s@10.0.0.1:7171",
        out="site-1",
        token="t0k",
    )
    # the whole command a site runs: the token, torchrun's restarts, every start resuming the site's checkpoint
    assert line == (
        "DILOCO_SYNCER_TOKEN=t0k torchrun --standalone --nproc-per-node 2 --max-restarts 3 -m diloco train "
        "--preset tiny --method decoupled --set replicas=2 --set sync_every=4 --set learner=1 "
        "--set syncer=s@10.0.0.1:7171 --out site-1 --resume auto"
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


def test_grpc_not_installed_is_a_config_error_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "grpc", None)  # `import grpc` raises ImportError
    with pytest.raises(ConfigError, match=r"pip install -e \.\[site\]"):
        connect_learner(_cfg(), learner=0, syncer="s@127.0.0.1:1", token="t")


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
        start = time.monotonic()  # a site's way in: its probe of syncer=NAME@HOST:PORT (gRPC, no Ray)
        with pytest.raises(ConfigError, match=rf"something answers at 127.0.0.1:{port} but not as a diloco syncer"):
            check_syncer(f"s@127.0.0.1:{port}", token="t")
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


@contextlib.contextmanager
def _black_hole():
    """A loopback port that drops connections instead of refusing them: a listening socket that never accepts,
    its accept queue (backlog 0) filled, so the kernel drops every further SYN (what a firewall's DROP rule
    does). Checked first: a plain connect there times out. Yields the port."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fill = []
        try:
            for _ in range(3):
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", port))
                fill.append(s)
            time.sleep(0.2)
            with pytest.raises(TimeoutError):  # the setup is a black hole, or this test would prove nothing
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            yield port
        finally:
            for s in fill:
                s.close()


def _site(tmp_path, token_cache, syncer: str):
    from diloco.train.config import TrainConfig, load_preset
    from diloco.train.trainer import Trainer

    sets = {"method": "decoupled", "replicas": 2, "num_fragments": 2, "sync_every": 4, "overlap_steps": 1}
    cfg = TrainConfig.from_dict({**load_preset("tiny")["base"], **sets, "learner": 0, "syncer": syncer, "steps": 8})
    return Trainer(cfg, tmp_path / "site", cache_dir=token_cache, progress=False)


def test_a_syncer_address_that_drops_packets_is_refused_within_the_probe_before_out_is_written(
    tmp_path, token_cache, monkeypatch
):
    """A site job whose syncer=NAME@HOST:PORT drops packets (nothing refuses: gRPC's connect just waits) is refused
    with a message that says so within the probe's deadline (plus 3 s for the job's own setup on a loaded machine),
    and its --out is never created. The deadline is PROBE_TIMEOUT_S = 5 s unless given; here, to keep the suite
    short, the probes (the direct one and the site job's) get 1 s (the same code path: the deadline is the gRPC
    call's timeout), and the default is checked to be PROBE_TIMEOUT_S."""
    assert check_syncer.__kwdefaults__["timeout_s"] == PROBE_TIMEOUT_S == 5.0
    deadline = 1.0
    monkeypatch.setitem(check_syncer.__kwdefaults__, "timeout_s", deadline)  # the site job's probe too
    monkeypatch.setenv("DILOCO_SYNCER_TOKEN", "t")
    with _black_hole() as port:
        start = time.monotonic()
        with pytest.raises(ConfigError, match=rf"nothing answered at 127.0.0.1:{port} within 1 s .*dropped"):
            check_syncer(f"s@127.0.0.1:{port}", token="t")
        assert deadline - 0.5 <= time.monotonic() - start < deadline + 3.0
        site = _site(tmp_path, token_cache, f"s@127.0.0.1:{port}")
        start = time.monotonic()
        with pytest.raises(ConfigError, match="within 1 s .*packets are dropped"):
            site.run(reuse=True)
        assert time.monotonic() - start < deadline + 3.0
    assert not (tmp_path / "site").exists()


def test_a_wrong_token_or_name_is_refused_saying_so_before_out_is_written(tmp_path, token_cache, monkeypatch):
    """The service's endpoint (a real gateway on loopback) refuses a call with a wrong token, or none, and a call
    for another syncer's name, with messages that say so, before any call reaches the syncer: its backend here
    fails the test if called (the only stand-in: what is checked comes before it). A site job with a wrong token
    is refused by its probe with its --out never created."""
    from diloco.decoupled.rpc.gateway import Gateway

    def backend(shard, method, args, timeout):
        raise AssertionError(f"a refused call reached the syncer: {method}")

    gateway = Gateway((backend, 1), name="s", token="right", host="127.0.0.1", port=0)
    port = gateway.start()
    try:
        assert check_syncer(f"s@127.0.0.1:{port}", token="right", num_shards=1)["syncer"] == "s"
        with pytest.raises(ConfigError, match="refused a call with a wrong token"):
            check_syncer(f"s@127.0.0.1:{port}", token="wrong")
        with pytest.raises(ConfigError, match="no token for the syncer"):  # told before a call is made
            check_syncer(f"s@127.0.0.1:{port}", token="")
        with pytest.raises(ConfigError, match="serves the syncer 's', not 'other'"):
            check_syncer(f"other@127.0.0.1:{port}", token="right")
        with pytest.raises(ConfigError, match="syncer_shards=1, this learner 2"):
            check_syncer(f"s@127.0.0.1:{port}", token="right", num_shards=2)
        with pytest.raises(ConfigError, match=f"cannot serve the sites on 127.0.0.1:{port} .*another --port"):
            Gateway((backend, 1), name="s2", token="x", host="127.0.0.1", port=port).start()  # no second server
        monkeypatch.setenv("DILOCO_SYNCER_TOKEN", "wrong")
        with pytest.raises(ConfigError, match="wrong token"):
            _site(tmp_path, token_cache, f"s@127.0.0.1:{port}").run(reuse=True)
        assert not (tmp_path / "site").exists()
    finally:
        gateway.stop()
