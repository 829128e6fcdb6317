"""The FP4 codecs' Triton kernels compile for an NVIDIA GPU (sm_90, Hopper) on a machine without one (Triton's LLVM
and ptxas do not need a driver), to PTX with none of what would change the reference's bits: no fused multiply-add,
no approximate division (``div.approx`` / ``div.full``), no flush of subnormals to zero (``.ftz``), and the
divisions IEEE-rounded (``div.rn.f32``). The interpreter tests (test_codec_triton.py) check the algorithm; these
the lowering, as far as the PTX shows it (ptxas keeps PTX's rounding: it is told ``--fmad=false``)."""

from __future__ import annotations

import importlib.util
import re

import pytest

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def compiled_module():
    """A fresh copy of diloco.wire.triton_fp4 built for the GPU compiler (TRITON_INTERPRET unset while it loads)."""
    mp = pytest.MonkeyPatch()
    mp.delenv("TRITON_INTERPRET", raising=False)
    try:
        spec = importlib.util.find_spec("diloco.wire.triton_fp4")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        mp.undo()
    return mod


def _ptx(mod, kernel: str) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    enc = {"x_ptr": "*fp32", "top_ptr": "*i32", "out_ptr": "*u8", "n": "i32", "n_code": "i32", "rows": "i32"}
    enc |= dict.fromkeys(("FMT", "ELEM_MAX", "TOP", "POW_J0", "J0", "R"), "constexpr")
    sources = {
        "abs_max": (mod._abs_max_kernel, {"x_ptr": "*fp32", "part_ptr": "*i32", "n": "i32", "TILE": "constexpr"}),
        "encode_e2m1": (mod._encode_kernel, enc),
        "encode_e3m0": (mod._encode_kernel, enc),
        "decode_e2m1": (
            mod._decode_kernel,
            {"p_ptr": "*u8", "out_ptr": "*fp32", "n": "i32", "n_code": "i32", "rows": "i32", "FMT": "constexpr"}
            | {"R": "constexpr"},
        ),
    }
    constants = {
        "abs_max": {"TILE": mod.TILE},
        "encode_e2m1": {"FMT": 0, "ELEM_MAX": 6.0, "TOP": 2688.0, "POW_J0": 4096.0, "J0": 12, "R": mod.ROWS},
        "encode_e3m0": {"FMT": 1, "ELEM_MAX": 16.0, "TOP": 7168.0, "POW_J0": 8192.0, "J0": 13, "R": mod.ROWS},
        "decode_e2m1": {"FMT": 0, "R": mod.ROWS},
    }
    fn, signature = sources[kernel]
    src = ASTSource(fn, signature, constants[kernel])
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(mod.OPTIONS)).asm["ptx"]


@pytest.mark.parametrize("kernel", ["abs_max", "encode_e2m1", "encode_e3m0", "decode_e2m1"])
def test_the_kernels_compile_to_ieee_ptx_without_fma_or_flush_to_zero(kernel, compiled_module):
    ptx = _ptx(compiled_module, kernel)
    bad = [line.strip() for line in ptx.splitlines() if re.search(r"\bfma\.|\bdiv\.(approx|full)|\.ftz\b", line)]
    assert not bad, f"{kernel}: {bad[:5]}"
    if kernel.startswith("encode"):
        assert "div.rn.f32" in ptx
        assert "mul.rn.f32" in ptx and "add.rn.f32" in ptx  # explicit rounding: ptxas may not contract them
