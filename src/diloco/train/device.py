"""The device a run trains on, checked before anything is written (``--device``, ``Trainer(device=...)``).

``torch.device("cuda")`` is a valid object on a machine without a GPU: the mistake only shows when
the first tensor moves there, as torch's ``AssertionError: Torch not compiled with CUDA enabled``
or a ``RuntimeError`` about ``CUDA_VISIBLE_DEVICES``, long after the run directory was created.
:func:`check_device` says it up front, as a ``ValueError`` naming the device and the fix.
"""

from __future__ import annotations

import os

import torch

from diloco.errors import ConfigError

__all__ = ["check_device"]


def check_device(device: str | torch.device, *, key: str | None = None) -> torch.device:
    """``device`` as a ``torch.device`` if this process can train on it; else a ValueError saying why. ``key``: the
    setting that named it, for the message (default: the ``--device`` option)."""
    name, fix = (f"{key}={device}", f"set {key}=cpu") if key else (f"--device {device}", "train with --device cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        what = f"{key}={device!r}" if key else f"--device {device!r}"
        raise ConfigError(f"{what} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise ConfigError(
                f"{name}: this torch ({torch.__version__}) was built without CUDA; "
                f"install a CUDA build of torch (https://pytorch.org/get-started/locally/) or {fix}"
            )
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            hint = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            raise ConfigError(
                f"{name}: no GPU is visible to this process{hint}; check nvidia-smi and the driver, or {fix}"
            )
        if dev.index is not None and dev.index >= count:
            raise ConfigError(
                f"{name}: this process sees {count} GPU(s), cuda:0 to cuda:{count - 1}; choose one of them"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"{name}: MPS is not available here; {fix}")
    return dev
