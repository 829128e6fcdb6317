"""Fused CPU loops for the codecs: ``blocks.c`` and ``stat.c`` beside this file, built with the system's C compiler on
first use.

The codecs' torch code (the reference, :meth:`diloco.wire.codec.Codec.encode_reference`) runs a dozen
tensor operations per value, each a pass over memory; the C loops do the same arithmetic in one pass, a
block at a time in registers, and produce the same bytes (``tests/unit/test_codec_native.py`` checks them
against the reference, also built for narrower CPUs' vector widths with :func:`build_for`). On CPU, :meth:`Codec.encode` and
:meth:`Codec.decode` take them where a codec has one (``bf16``, ``int8``, ``fp4_e2m1``, ``fp4_e3m0``,
``stat2``, ``stat4``);
elsewhere (CUDA, no compiler, ``DILOCO_NATIVE_CODECS=0``) they run the torch code.

Build. ``$CC`` (default ``gcc``, else ``cc``) with ``-O3 -march=native -ffp-contract=off`` (no fused
multiply-add: the reference rounds every product; no ``-ffast-math``, so every operation stays IEEE, and
``-fno-trapping-math`` only lets loops with selects vectorize) into ``$DILOCO_KERNEL_CACHE`` (default
``~/.cache/diloco``), named by a hash of the source, the flags and the CPU's feature flags, written
atomically (ranks starting together build it once each, harmlessly). About a second; later processes
load the built file. A failed build or load logs a warning once and the codecs run the torch code.

Threads. A call splits its blocks across ``torch.get_num_threads()`` threads (fewer for small tensors) with
OpenMP, on the runtime torch runs on (its ``libgomp.so.1``, which the built library links by the same
name): one thread pool in the process, so the codecs' threads and torch's do not compete for the cores.
ctypes releases the GIL while C runs.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

log = logging.getLogger(__name__)

#: Set to ``0`` to run the codecs' torch code instead of the C loops.
ENV_SWITCH = "DILOCO_NATIVE_CODECS"
#: Where the built library is kept (default ``~/.cache/diloco``).
ENV_CACHE = "DILOCO_KERNEL_CACHE"
#: The ``-march`` the loops are built for (default ``native``, this CPU): ``x86-64-v3`` (AVX2) or ``x86-64`` (SSE2)
#: run here what a narrower CPU runs, e.g. the test suite as such a CPU would (``scripts/stress_suite.sh``).
ENV_MARCH = "DILOCO_NATIVE_MARCH"
_HERE = Path(__file__).parent
_SOURCES = (_HERE / "blocks.c", _HERE / "stat.c")
_HEADERS = (_HERE / "common.h",)
_FLAGS = (
    "-O3",
    "-march=native",
    "-ffp-contract=off",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-fopenmp",
    "-shared",
    "-fPIC",
)
#: Values below which a call runs on one thread (a thread hand-off costs more than the work).
MIN_PARALLEL = 1 << 16

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "encode_blocks_mt": (None, [_P, _I64, _I64, _I32, _I32, _F32, _F32, _P, _P, _P, _I32]),
    "decode_blocks_mt": (None, [_P, _P, _I64, _I64, _I32, _P, _P, _F32, _P, _I32]),
    "bf16_encode_mt": (ctypes.c_int32, [_P, _I64, _P, _I32]),
    "bf16_decode_mt": (None, [_P, _I64, _P, _I32]),
    "abs_bits_max_mt": (ctypes.c_int32, [_P, _I64, _I32]),
    "stat_encode_mt": (ctypes.c_int32, [_P, _I64, _I64, _I32, _F32, _F32, _P, _P, _P, _I32]),
    "stat_decode_mt": (None, [_P, _P, _I64, _I64, _I32, _P, _I32]),
}


def enabled() -> bool:
    """Whether the C loops may be used (``DILOCO_NATIVE_CODECS`` is not ``0``)."""
    return os.environ.get(ENV_SWITCH, "1").strip() != "0"


def march_setting() -> str:
    """The ``-march`` to build for: ``DILOCO_NATIVE_MARCH``, default ``native``."""
    return os.environ.get(ENV_MARCH, "").strip() or "native"


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        return ""


def _build(cc: str, out: Path, *, march: str = "native", sources: tuple[Path, ...] = _SOURCES) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    flags = [f"-march={march}" if f == "-march=native" else f for f in _FLAGS]
    try:
        subprocess.run([cc, *flags, *map(str, sources), "-o", tmp, "-lm"], check=True, capture_output=True, timeout=120)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _bind(lib: ctypes.CDLL) -> ctypes.CDLL:
    """``lib`` with the argument and result types of the entry points it has."""
    for name, (restype, argtypes) in _SIGNATURES.items():
        if hasattr(lib, name):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    return lib


def _compiler() -> str | None:
    """``$CC`` (default ``gcc``), else ``cc``, as a path; None where there is none."""
    return shutil.which(os.environ.get("CC", "gcc")) or shutil.which("cc")


def build_for(march: str, out: Path) -> ctypes.CDLL:
    """``blocks.c`` built for ``-march=march`` into ``out`` and loaded: the loops another CPU runs (their vector
    width follows its registers: 16 floats with AVX-512, 8 with AVX, 4 below), for tests on this one."""
    cc = _compiler()
    assert cc is not None
    _build(cc, out, march=march, sources=(_HERE / "blocks.c",))
    return _bind(ctypes.CDLL(str(out)))


@functools.cache
def library() -> ctypes.CDLL | None:
    """The built library, or None where it cannot be built or loaded (a warning says why, once)."""
    cc = _compiler()
    if cc is None:
        log.warning("no C compiler found ($CC, gcc, cc): the codecs run their torch code (slower on CPU)")
        return None
    try:
        sources = [f.read_bytes() for f in (*_SOURCES, *_HEADERS)]
        march = march_setting()
        flags = " ".join(_FLAGS) + ("" if march == "native" else f" -march={march}")
        key = hashlib.sha256(b"\0".join([*sources, flags.encode(), cc.encode(), _cpu_flags().encode()]))
        cache = Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "diloco")
        path = cache / f"codecs-{key.hexdigest()[:16]}.so"
        if not path.exists():
            _build(cc, path, march=march)
        lib = ctypes.CDLL(str(path))
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        log.warning("building the C loops failed (%s %s): the codecs run their torch code", e, detail[-500:])
        return None
    return _bind(lib)


def usable(x: torch.Tensor) -> bool:
    """Whether an encode / decode of ``x`` (a CPU tensor) runs the C loops."""
    return x.device.type == "cpu" and enabled() and library() is not None


def threads(values: int) -> int:
    """Threads for a call over ``values`` values of work: ``torch.get_num_threads()``, fewer for small calls
    (a thread's start costs more than :data:`MIN_PARALLEL` values of work)."""
    return max(1, min(torch.get_num_threads(), values // MIN_PARALLEL))


def ptr(t: torch.Tensor) -> int:
    """The address of a contiguous tensor's first element, for a C call."""
    assert t.is_contiguous() and t.device.type == "cpu"
    return t.data_ptr()


def abs_bits_max(x: torch.Tensor) -> int:
    """The largest magnitude bits (``bits & 0x7FFFFFFF``) of contiguous fp32 CPU ``x``, in one pass: 0x7F800000 or
    more exactly when ``x`` holds a NaN or inf. The caller checks :func:`usable` first."""
    lib = library()
    assert lib is not None and x.dtype == torch.float32 and x.numel() > 0
    return int(lib.abs_bits_max_mt(ptr(x), x.numel(), threads(x.numel())))


__all__ = [
    "ENV_CACHE",
    "ENV_MARCH",
    "build_for",
    "ENV_SWITCH",
    "MIN_PARALLEL",
    "abs_bits_max",
    "enabled",
    "library",
    "march_setting",
    "ptr",
    "threads",
    "usable",
]
