"""The public face: ``import diloco`` is lazy, every exported name resolves, torch-free modules stay torch-free."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _python(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_sim_traffic_schedule_and_the_package_never_import_torch():
    out = _python("import sys, diloco, diloco.sim, diloco.traffic, diloco.algorithm.schedule, "
                  "diloco.methods, diloco.layout, diloco.algorithm, diloco.comm, diloco.train, diloco.scaling\n"
                  "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    assert out == "[]"


def test_the_users_import_line_works():
    out = _python("from diloco import StreamingDiLoCo, DataParallel, run_replicas, Schedule, "
                  "TorchDistCommunicator, setup_communicators, TrainConfig, train, get_codec, CODEC_NAMES\n"
                  "print(StreamingDiLoCo.__module__, DataParallel.__module__, run_replicas.__module__, "
                  "setup_communicators.__module__)")
    assert out == ("diloco.algorithm.streaming diloco.algorithm.data_parallel diloco.comm.local "
                   "diloco.distributed.launch")


@pytest.mark.parametrize("package", ["diloco", "diloco.algorithm", "diloco.comm", "diloco.train"])
def test_every_exported_name_resolves_and_is_listed(package):
    import importlib

    mod = importlib.import_module(package)
    assert mod.__all__, package
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{package}.{name}"
        assert name in dir(mod)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        mod.nope  # noqa: B018


def test_train_is_one_callable_whatever_was_imported_before():
    """``diloco.train`` is the subpackage and the function: importing diloco.train.config first changes nothing."""
    out = _python("import diloco.train.config, diloco\nfrom diloco import train\n"
                  "import diloco.train.trainer as t\nprint(callable(train), train is diloco.train, t.train.__name__)")
    assert out == "True True train"


def test_codec_registry_is_public():
    import diloco

    assert set(diloco.CODEC_NAMES) >= {"fp32", "bf16", "fp4_e3m0", "fp4_e2m1", "int8", "fp8_e4m3"}
    assert diloco.get_codec("fp4_e3m0").name == "fp4_e3m0"
    with pytest.raises(ValueError, match="unknown codec 'fp5'; valid names"):
        diloco.get_codec("fp5")
