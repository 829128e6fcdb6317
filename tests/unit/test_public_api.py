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
    out = _python(
        "import sys, diloco, diloco.sim, diloco.traffic, diloco.algorithm.schedule, "
        "diloco.methods, diloco.layout, diloco.algorithm, diloco.comm, diloco.train, diloco.scaling, diloco.wire, "
        "diloco.wire.sizes\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    assert out == "[]"


def test_the_users_import_line_works():
    out = _python(
        "from diloco import StreamingDiLoCo, DataParallel, run_replicas, Schedule, "
        "TorchDistCommunicator, setup_communicators, TrainConfig, train_model, get_codec, CODEC_NAMES\n"
        "print(StreamingDiLoCo.__module__, DataParallel.__module__, run_replicas.__module__, "
        "setup_communicators.__module__)"
    )
    assert out == (
        "diloco.algorithm.streaming diloco.algorithm.data_parallel diloco.comm.local diloco.distributed.launch"
    )


@pytest.mark.parametrize(
    "package", ["diloco", "diloco.algorithm", "diloco.comm", "diloco.train", "diloco.decoupled", "diloco.wire"]
)
def test_every_exported_name_resolves_and_is_listed(package):
    import importlib

    mod = importlib.import_module(package)
    assert mod.__all__, package
    for name in mod.__all__:
        assert getattr(mod, name) is not None, f"{package}.{name}"
        assert name in dir(mod)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        mod.nope  # noqa: B018


def test_the_trainer_function_has_a_plain_name_and_the_package_is_a_plain_module():
    """``diloco.train`` is a subpackage (a plain module); the function that trains is ``train_model``."""
    out = _python(
        "import types, diloco\nfrom diloco import train_model\nimport diloco.train as t\n"
        "print(type(t) is types.ModuleType, callable(t), train_model is t.train_model, train_model.__name__)"
    )
    assert out == "True False True train_model"


def test_codec_registry_is_public():
    import diloco

    assert set(diloco.CODEC_NAMES) >= {"fp32", "bf16", "fp4_e3m0", "fp4_e2m1", "int8", "fp8_e4m3"}
    assert diloco.get_codec("fp4_e3m0").name == "fp4_e3m0"
    with pytest.raises(ValueError, match="unknown codec 'fp5'; valid names"):
        diloco.get_codec("fp5")
