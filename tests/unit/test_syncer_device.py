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
