"""The syncer's memory, checked against the host before anything is written."""

from __future__ import annotations

import pytest
from _tiny import make_model

from diloco.decoupled.capacity import available_bytes, check_syncer_memory, syncer_bytes
from diloco.sim.syncer_cost import SYNCER_COSTS, memory_bytes
from diloco.train.config import TrainConfig, load_preset


def _cfg(**kw) -> TrainConfig:
    return TrainConfig.from_dict({**load_preset("tiny")["base"], "method": "decoupled", **kw})


def test_the_need_is_the_planners_closed_form():
    model = make_model()
    n = sum(p.numel() for p in model.parameters())
    need, source = syncer_bytes(_cfg(codec="fp32", num_fragments=1), model, None)
    assert need == memory_bytes(SYNCER_COSTS["fp32"], num_params=n, fragment_values=n)  # one fragment: the model
    assert need > 4 * 3 * n and "syncer_merge.json" in source
    lossy, _ = syncer_bytes(_cfg(codec="fp4_e3m0", num_fragments=1), model, None)
    assert lossy > need  # the shared copy of a lossy reply


def test_a_host_too_small_is_refused_naming_the_memory_and_the_fixes():
    model = make_model()
    need, _ = syncer_bytes(_cfg(), model, None)
    check_syncer_memory(_cfg(), model, None, available=int(need) + 1)  # fits: nothing said
    with pytest.raises(ValueError, match=r"the syncer needs about .* GiB .* available.*diloco syncer.*num_fragments"):
        check_syncer_memory(_cfg(), model, None, available=int(need) - 1)


def test_this_host_says_what_it_has(tmp_path):
    got = available_bytes()
    assert got is None or got > 0
    (tmp_path / "meminfo").write_text("MemTotal: 100 kB\nMemAvailable: 64 kB\n")
    assert available_bytes(tmp_path / "meminfo") == 64 * 1024
    assert available_bytes(tmp_path / "missing") is None


def test_a_run_whose_syncer_does_not_fit_writes_nothing(tmp_path, token_cache, monkeypatch):
    import diloco.decoupled.capacity as capacity
    from diloco.train.trainer import Trainer

    monkeypatch.setattr(capacity, "available_bytes", lambda: 1024)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="the syncer needs about"):
        Trainer(_cfg(steps=4), out, cache_dir=token_cache, progress=False).run()
    assert not out.exists()


def test_shards_hold_their_fragments_and_a_working_set_each():
    from diloco.algorithm.fragments import split_fragments
    from diloco.decoupled.capacity import shard_bytes

    model = make_model()
    one = _cfg(num_fragments=4)
    assert shard_bytes(one, model, None) == [syncer_bytes(one, model, None)[0]]
    two = _cfg(num_fragments=4, syncer_shards=2, codec="fp4_e3m0")
    split = [f.numel for f in split_fragments(model, 4, pattern=two.fragment_pattern)]
    cost = SYNCER_COSTS["fp4_e3m0"]
    want = [
        memory_bytes(cost, num_params=split[s] + split[s + 2], fragment_values=max(split[s], split[s + 2]))
        for s in (0, 1)
    ]
    assert shard_bytes(two, model, None) == want  # shard s: fragments s and s + 2 (p % S == s)


def test_shards_on_a_ray_cluster_must_each_fit_and_on_this_host_all_of_them():
    model = make_model()
    cfg = _cfg(num_fragments=4, syncer_shards=2)
    from diloco.decoupled.capacity import shard_bytes

    shards = shard_bytes(cfg, model, None)
    room = int(max(shards)) + 1  # the largest shard fits, not both
    assert room < sum(shards)
    check_syncer_memory(cfg, model, None, on_cluster=True, available=room)  # each shard on a node of its own
    with pytest.raises(ValueError, match=r"the syncer needs about .* syncer_shards=2\) and this host"):
        check_syncer_memory(cfg, model, None, available=room)  # both shards here
    with pytest.raises(ValueError, match=r"its largest of 2 shards needs about"):
        check_syncer_memory(cfg, model, None, on_cluster=True, available=room - 2)


def test_a_gpu_syncer_on_a_cluster_is_not_checked_against_this_host():
    model = make_model()
    check_syncer_memory(_cfg(syncer_device="cuda"), model, None, on_cluster=True, available=1)  # no GPU needed here
