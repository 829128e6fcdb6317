"""The syncer as a service (``diloco syncer``) and the learners' handshake with it, without a running service: the
config fingerprint, the learner's command, the out folder, a missing Ray, an address that is no Ray cluster.
The service itself, with learners that are site jobs (refusals on the live run, a syncer restart, the export of
its folder): test_site_faults.py. Skipped when Ray is not installed."""

from __future__ import annotations

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
