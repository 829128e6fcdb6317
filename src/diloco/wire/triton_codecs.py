"""Where the FP4 codecs run their Triton kernels (:mod:`diloco.wire.triton_fp4`): CUDA tensors, when triton imports.

:meth:`BlockScaledCodec.encode`, :meth:`decode` and :meth:`decode_into` of ``fp4_e2m1`` and ``fp4_e3m0`` at their
defaults (block 16, 4 scale candidates) take the kernels for a tensor on a CUDA device; other settings, other
devices, no triton (it ships with CUDA builds of torch; the library does not require it) or a switch set to ``0``
run the torch reference. The kernels give the reference's bytes and bits (their module says how, and what is
tested where). Before a device first uses them they encode and decode a few thousand awkward values (ties at
every scale, zero, tiny and huge blocks, a ragged tail) and compare with the reference: a mismatch or a failure
to compile logs a warning once and that device runs the reference.

Switches: ``DILOCO_TRITON_CODECS=0`` turns the kernels off; ``DILOCO_NATIVE_CODECS=0`` turns off every fused
codec path, the CPU's C loops (:mod:`diloco.wire.native`) and these.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from types import ModuleType
from typing import TYPE_CHECKING

import torch

from diloco.wire import native

if TYPE_CHECKING:
    from diloco.wire.codec import Codec
    from diloco.wire.scaled import BlockScaledCodec

log = logging.getLogger(__name__)

#: Set to ``0`` to run the FP4 codecs' torch code on CUDA instead of the Triton kernels.
ENV_SWITCH = "DILOCO_TRITON_CODECS"


def enabled() -> bool:
    """Whether the kernels may be used: neither ``DILOCO_TRITON_CODECS`` nor ``DILOCO_NATIVE_CODECS`` is ``0``."""
    return os.environ.get(ENV_SWITCH, "1").strip() != "0" and native.enabled()


@functools.cache
def kernels() -> ModuleType | None:
    """:mod:`diloco.wire.triton_fp4`, or None where triton does not import (said once, in the debug log)."""
    try:
        from diloco.wire import triton_fp4
    except Exception as e:  # ImportError, or a triton that fails on import
        log.debug("triton unavailable (%s): the FP4 codecs run their torch code on CUDA", e)
        return None
    return triton_fp4


def element_format(codec: Codec) -> int | None:
    """The kernels' number for the codec's format (0 E2M1, 1 E3M0), None for anything they do not take."""
    from diloco.wire.scaled import FP4E2M1Codec, FP4E3M0Codec

    fmt = {FP4E2M1Codec: 0, FP4E3M0Codec: 1}.get(type(codec))
    return fmt if fmt is not None and codec.block_size == 16 and codec.scale_candidates == 4 else None


def usable(codec: Codec, t: torch.Tensor) -> bool:
    """Whether an encode of ``t`` / a decode of payload ``t`` by ``codec`` runs the kernels."""
    if t.device.type != "cuda" or element_format(codec) is None or not enabled():
        return False
    mod = kernels()
    return mod is not None and _verified(t.device.index if t.device.index is not None else torch.cuda.current_device())


def encode(codec: BlockScaledCodec, x32: torch.Tensor, *, mod: ModuleType | None = None) -> torch.Tensor:
    """``codec.encode_reference(x32)`` for contiguous fp32 ``x32`` with at least one value, by the kernels of ``mod``
    (default :func:`kernels`; the tests pass a copy built for Triton's interpreter)."""
    fmt = element_format(codec)
    assert fmt is not None and x32.dtype == torch.float32 and x32.is_contiguous() and x32.numel() > 0
    mod = mod or kernels()
    payload = torch.empty(codec.num_bytes(x32.numel()), dtype=torch.uint8, device=x32.device)
    with _on(x32.device):
        mod.encode(x32, payload, fmt=fmt, elem_max=codec.element_max, top=codec._top, j0=codec._j0)
    return payload


def decode(
    codec: BlockScaledCodec,
    payload: torch.Tensor,
    numel: int,
    out: torch.Tensor | None = None,
    *,
    mod: ModuleType | None = None,
) -> torch.Tensor:
    """``codec.decode_reference(payload, numel)`` (a checked payload, ``numel > 0``), into ``out`` if given."""
    fmt = element_format(codec)
    assert fmt is not None and numel > 0
    mod = mod or kernels()
    out = torch.empty(numel, dtype=torch.float32, device=payload.device) if out is None else out
    with _on(payload.device):
        mod.decode(payload.contiguous(), numel, out, fmt=fmt)
    return out


def _on(device: torch.device) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device: make it the tensor's (a no-op on the CPU, in the interpreter)."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def check_values() -> torch.Tensor:
    """A few thousand values that exercise every branch: rounding ties at E4M3 block scales (16-block runs),
    quarters, zero, tiny and huge blocks, a ragged tail."""
    g = torch.Generator().manual_seed(0)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.125, 0.1875, 0.375, 1.5, 3.0, 6.0, 12.0, 24.0])
    ties = mids[torch.randint(0, len(mids), (128, 16), generator=g)]
    ties *= torch.randint(0, 2, ties.shape, generator=g) * 2.0 - 1.0
    ties[:, 0] = torch.tensor([6.0, 16.0])[torch.randint(0, 2, (128,), generator=g)]
    ties *= torch.randint(8, 120, (128,), generator=g).to(torch.uint8).view(torch.float8_e4m3fn).float().unsqueeze(1)
    groups = torch.randn(1024, generator=g)
    groups.view(-1, 16)[::3] = 0.0
    groups.view(-1, 16)[1::5] *= 1e-30
    groups.view(-1, 16)[2::7] *= 1e20
    quarters = torch.randint(-24, 25, (1024,), generator=g).float() / 4
    return torch.cat([ties.flatten(), groups, quarters, torch.randn(37, generator=g) * 1e-3])


@functools.cache
def _verified(device: int) -> bool:
    """Whether the kernels give the reference's bytes and bits on CUDA device ``device`` (checked once)."""
    from diloco.wire.scaled import FP4E2M1Codec, FP4E3M0Codec

    x = check_values().to(f"cuda:{device}")
    try:
        for codec in (FP4E2M1Codec(), FP4E3M0Codec()):
            ref = codec.encode_reference(x)
            same = torch.equal(encode(codec, x), ref)
            want = codec.decode_reference(ref, x.numel())
            same = same and torch.equal(decode(codec, ref, x.numel()).view(torch.int32), want.view(torch.int32))
            if not same:
                log.warning(
                    "the Triton FP4 kernels differ from the torch reference on cuda:%d (%s): the codecs run the "
                    "torch code there",
                    device,
                    codec.name,
                )
                return False
    except Exception as e:  # a compile failure, an unsupported GPU
        log.warning("the Triton FP4 kernels failed on cuda:%d (%s): the codecs run the torch code there", device, e)
        return False
    return True


__all__ = ["ENV_SWITCH", "check_values", "decode", "element_format", "enabled", "encode", "kernels", "usable"]
