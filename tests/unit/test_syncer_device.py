"""``syncer_device``: the syncer's state and merge on one device, what leaves it on the CPU, a state that loads on
any device, and a device this host lacks refused up front, naming the setting and the fix.

On a machine without a GPU these run the ``cpu`` device (that ``cpu`` is the syncer as it was, bit for bit, is
``test_syncer_streaming.py``'s reference comparison, which runs the default); ``tests/gpu/test_gpu_syncer.py`` runs
the same checks on CUDA and compares a CUDA merge with the CPU merge.
"""

from __future__ import annotations

import pytest
import torch
from _syncers import Model, check_round_trip, check_state_devices

from diloco.decoupled.syncer import Syncer
from diloco.decoupled.syncer_device import resolve_syncer_device, to_host
from diloco.errors import ConfigError
from diloco.train.config import TrainConfig


def test_the_state_lives_on_the_syncer_device_and_what_leaves_it_is_on_the_cpu():
    check_state_devices("cpu")


def test_a_state_round_trips_across_devices():
    check_round_trip("cpu", "cpu")


def test_to_host_keeps_cpu_tensors_and_their_sharing():
    t = torch.arange(4.0)
    out = to_host({"a": [t, t], "b": (t, 1), "c": "x"})
    assert out["a"][0] is t and out["a"][1] is t and out["b"] == (t, 1) and out["c"] == "x"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without a GPU")
def test_a_gpu_this_host_lacks_is_refused_naming_the_setting_and_the_fix():
    for value in ("cuda", "cuda:1"):
        with pytest.raises(ConfigError, match=rf"syncer_device={value}: .*set syncer_device=cpu"):
            resolve_syncer_device(value)
        with pytest.raises(ConfigError, match=rf"syncer_device={value}"):
            Syncer(Model(), num_learners=2, device=value)
    assert resolve_syncer_device("auto") == torch.device("cpu")
    cfg = TrainConfig(method="decoupled", syncer_device="cuda", steps=10)  # the config names a device: valid
    from diloco.decoupled.runtime import RUNTIME

    with pytest.raises(ConfigError, match="syncer_device=cuda"):  # where the syncer runs, before anything is written
        RUNTIME.check_inputs(cfg, template=Model(), fragments=None)


def test_a_name_that_is_no_device_is_refused_by_the_config():
    assert TrainConfig(method="decoupled", steps=10).syncer_device == "cpu"
    for value in ("gpu", "meta"):
        with pytest.raises(ValueError, match=f"syncer_device='{value}' is not a device the syncer runs on.*cpu, auto"):
            TrainConfig(method="decoupled", syncer_device=value, steps=10)


def test_make_syncer_puts_the_syncer_on_the_config_device():
    from diloco.decoupled.trainer import make_syncer

    cfg = TrainConfig(method="decoupled", syncer_device="auto", replicas=2, steps=10)
    assert make_syncer(cfg, Model()).device == resolve_syncer_device("auto")


def test_a_ray_actor_given_one_gpu_sees_it_as_cuda():
    from diloco.decoupled.syncer_device import actor_device

    assert [actor_device(v) for v in ("cpu", "auto", "cuda", "cuda:0", "cuda:3")] == [
        "cpu",
        "auto",
        "cuda",
        "cuda",
        "cuda",
    ]


def test_syncers_off_the_cpu_are_built_in_their_actors():
    from _tiny import make_model

    from diloco.decoupled.ray_syncers import syncers_for_ray
    from diloco.decoupled.syncer import Syncer
    from diloco.train.config import TrainConfig, load_preset

    def cfg(**kw):
        base = {**load_preset("tiny")["base"], "method": "decoupled", "num_fragments": 2, "syncer_shards": 2}
        return TrainConfig.from_dict({**base, **kw})

    model = make_model()
    here, gpus = syncers_for_ray(cfg(), model, None)
    assert gpus == 0 and all(isinstance(s, Syncer) for s in here)  # the CPU syncer: built here, as always
    there, gpus = syncers_for_ray(cfg(syncer_device="auto"), model, None)
    assert gpus == int(torch.cuda.is_available()) and not any(isinstance(s, Syncer) for s in there)
    built = [f() for f in there]  # what each actor runs: shard s of the same syncer
    for a, b in zip(here, built, strict=True):
        assert a.device == b.device and [f.names for f in a.fragments] == [f.names for f in b.fragments]
        assert all(torch.equal(x, y) for x, y in zip(a.global_flat, b.global_flat, strict=True))
    _, gpus = syncers_for_ray(cfg(syncer_device="cuda:1"), model, None)
    assert gpus == 1  # its actor asks Ray for the GPU, where it is cuda (actor_device)
