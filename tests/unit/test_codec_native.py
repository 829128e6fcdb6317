"""The C loops of the codecs (diloco.wire.native) give the bytes of the torch reference, bit for bit."""

from __future__ import annotations

import platform

import pytest
import torch
from _codec_cases import graded_blocks, order_sensitive_blocks, uniform_ties

from diloco.wire import native
from diloco.wire.codec import halves_sum
from diloco.wire.registry import get_codec

NATIVE = ("bf16", "int8", "fp4_e2m1", "fp4_e3m0", "stat2", "stat4")
needs_native = pytest.mark.skipif(
    not native.enabled() or native.library() is None, reason="C loops off or no C compiler: the torch code runs"
)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bytes (payloads) or equal fp32 bit patterns, any NaN equal to any NaN."""
    if a.dtype == torch.uint8:
        return a.shape == b.shape and torch.equal(a, b)
    return a.shape == b.shape and bool(((a.view(torch.int32) == b.view(torch.int32)) | (a.isnan() & b.isnan())).all())


def _inputs() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    cases: list[tuple[str, torch.Tensor]] = []
    for n in (1, 2, 15, 16, 17, 33, 1001, 70_001):  # odd lengths: a partial last block, a half-filled last byte
        for scale in (1e-38, 1e-6, 1.0, 1e6, 1e36):
            cases.append((f"normal n={n} scale={scale}", torch.randn(n, generator=g) * scale))
    cases.append(("zeros", torch.zeros(100)))
    cases.append(("signed zeros", torch.tensor([0.0, -0.0] * 50)))
    cases.append(("subnormals", torch.randn(300, generator=g) * 1e-42))
    mixed = torch.randn(5000, generator=g)
    mixed[::7], mixed[::11], mixed[::13] = 0.0, mixed[::11] * 1e-30, -0.0
    cases.append(("mixed blocks", mixed))
    groups = torch.randn(4096 + 48, generator=g)  # 16-block groups holding zero, tiny and huge blocks
    groups.view(-1, 16)[::3] = 0.0
    groups.view(-1, 16)[1::5] *= 1e-30
    groups.view(-1, 16)[2::7] *= 1e20
    cases.append(("zero, tiny and huge blocks", groups))
    cases.append(("fp32 extremes", torch.tensor([3.4e38, -3.4e38, 1.0, 1e-45] * 25)))
    cases.append(("beyond bf16 max", torch.tensor([3.39e38, -3.39e38, 3.3895e38, 1.0] * 25)))
    for bad in (float("nan"), float("inf"), float("-inf")):
        x = torch.randn(1000, generator=g)
        x[517] = bad
        cases.append((f"non-finite {bad}", x))
    # values on the rounding midpoints of E2M1 and E3M0 at every candidate scale, and of int8
    for mid in (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.125, 0.375, 1.5, 3.0, 6.0, 12.0, 24.0):
        x = torch.full((64,), mid)
        x[0] = 6.0
        cases.append((f"ties {mid}", x))
        cases.append((f"ties -{mid}", -x))
    # the same midpoints in runs of 16 blocks (the C loops take 16 blocks at a time, a block a vector lane), each
    # block's largest E2M1's or E3M0's top (6, 16) and its scale an E4M3 value, so that the ties fall on the scales
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.125, 0.1875, 0.375, 1.5, 3.0, 6.0, 12.0, 24.0])
    lanes = mids[torch.randint(0, len(mids), (1024, 16), generator=g)]
    lanes *= torch.randint(0, 2, lanes.shape, generator=g) * 2.0 - 1.0
    lanes[:, 0] = torch.tensor([6.0, 16.0])[torch.randint(0, 2, (1024,), generator=g)]
    codes = torch.randint(8, 120, (1024,), generator=g).to(torch.uint8)
    lanes *= codes.view(torch.float8_e4m3fn).float().unsqueeze(1)
    cases.append(("ties in 16-block runs", lanes.flatten()))
    quarters = torch.randint(-24, 25, (4096,), generator=g).float() / 4  # many exact ties, any block scale
    cases.append(("quarters", quarters))
    cases.append(("halves", torch.randint(-255, 256, (4096,), generator=g).float() / 2))
    cases.append(("order-sensitive blocks", order_sensitive_blocks()))
    cases.append(("uniform ties", uniform_ties()))
    cases.append(("graded blocks", graded_blocks()))
    cases.append(("bf16 in", torch.randn(5000, generator=g).to(torch.bfloat16)))
    cases.append(("fp64 in", torch.randn(5000, generator=g).double() * 1e300))
    return cases


CASES = _inputs()


@needs_native
@pytest.mark.parametrize("name", NATIVE)
def test_the_c_loops_give_the_reference_bytes_and_bits(name):
    codec = get_codec(name)
    for label, x in CASES:
        n = x.numel()
        assert native.usable(x)
        ref = codec.encode_reference(x)
        assert same_bits(codec.encode(x), ref), f"{name} encode: {label}"
        want = codec.decode_reference(ref, n)
        assert same_bits(codec.decode(ref, n), want), f"{name} decode: {label}"
        out = torch.full((n,), 7.0)
        assert same_bits(codec.decode_into(ref, n, out), want), f"{name} decode_into: {label}"


@needs_native
@pytest.mark.skipif(platform.machine() != "x86_64", reason="builds for x86-64 CPUs narrower than this one")
@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64"])  # AVX2: 8-float vectors; SSE2: 4
def test_the_loops_of_narrower_cpus_give_the_reference_bytes_too(march, tmp_path, monkeypatch):
    from diloco.wire.native import blocks

    monkeypatch.setattr(blocks, "library", lambda: native.build_for(march, tmp_path / f"{march}.so"))
    lib = blocks.library()
    monkeypatch.setattr(blocks, "library", lambda: lib)
    for name in ("fp4_e2m1", "fp4_e3m0", "int8", "bf16"):
        codec = get_codec(name)
        for label, x in CASES:
            ref = codec.encode_reference(x)
            assert same_bits(codec.encode(x), ref), f"{march} {name} encode: {label}"
            out = torch.full((x.numel(),), 7.0)
            want = codec.decode_reference(ref, x.numel())
            assert same_bits(codec.decode_into(ref, x.numel(), out), want), f"{march} {name} decode: {label}"


@needs_native
@pytest.mark.parametrize("name", NATIVE)
@pytest.mark.parametrize("threads", [1, 3])
def test_the_split_across_threads_changes_no_bit(name, threads):
    codec = get_codec(name)
    x = torch.randn(4 * native.MIN_PARALLEL + 37, generator=torch.Generator().manual_seed(threads))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        payload = codec.encode(x)
        decoded = codec.decode(payload, x.numel())
    finally:
        torch.set_num_threads(before)
    assert same_bits(payload, codec.encode_reference(x))
    assert same_bits(decoded, codec.decode_reference(payload, x.numel()))


@needs_native
@pytest.mark.parametrize("name", ("int8", "fp4_e2m1", "fp4_e3m0"))
def test_any_payload_decodes_to_the_reference_bits(name):
    # arbitrary bytes: every code, NaN and huge block scales, tensor scales up to E8M0's NaN (the clamp at fp32's max)
    codec = get_codec(name)
    g = torch.Generator().manual_seed(5)
    for n in (16, 17, 4096 + 33):
        for t in (0, 100, 127, 200, 254, 255):
            payload = torch.randint(0, 256, (codec.num_bytes(n),), dtype=torch.uint8, generator=g)
            payload[-1] = t
            want = codec.decode_reference(payload, n)
            assert same_bits(codec.decode(payload, n), want), f"{name} n={n} t={t}"
            assert same_bits(codec.decode_into(payload, n, torch.full((n,), 7.0)), want), f"{name} n={n} t={t}"


def test_a_payload_at_an_odd_offset_decodes_the_same():
    for name in NATIVE:
        codec = get_codec(name)
        x = torch.randn(1001, generator=torch.Generator().manual_seed(2))
        payload = codec.encode(x)
        shifted = torch.cat([torch.zeros(1, dtype=torch.uint8), payload])[1:]
        assert same_bits(codec.decode(shifted, 1001), codec.decode_reference(payload, 1001)), name


def test_the_switch_turns_the_c_loops_off(monkeypatch):
    x = torch.randn(100)
    monkeypatch.setenv(native.ENV_SWITCH, "0")
    assert not native.usable(x)
    for name in NATIVE:
        codec = get_codec(name)
        assert same_bits(codec.encode(x), codec.encode_reference(x))


def test_without_a_library_the_codecs_run_their_torch_code(monkeypatch):
    monkeypatch.setattr(native, "library", lambda: None)
    x = torch.randn(3000, generator=torch.Generator().manual_seed(3))
    assert not native.usable(x)
    for name in NATIVE:
        codec = get_codec(name)
        payload = codec.encode(x)
        assert same_bits(payload, codec.encode_reference(x))
        assert same_bits(codec.decode(payload, 3000), codec.decode_reference(payload, 3000))


def test_no_compiler_means_no_library_and_a_warning(monkeypatch, caplog):
    monkeypatch.setenv("CC", "no-such-compiler")
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    native.library.cache_clear()
    try:
        assert native.library() is None
        assert "no C compiler" in caplog.text
    finally:
        native.library.cache_clear()


def test_halves_sum_adds_the_halves_first():
    g = torch.Generator().manual_seed(4)
    for width in (1, 2, 6, 16, 32, 1000, 1024):
        e = (torch.randn(500, width, generator=g) * torch.rand(500, width, generator=g).mul(40).exp2()).square()
        cols = [e[:, j] for j in range(width)]
        while len(cols) > 1:
            if len(cols) % 2:
                cols = [cols[0] + cols[-1], *cols[1:-1]]
            h = len(cols) // 2
            cols = [a + b for a, b in zip(cols[:h], cols[h:], strict=True)]
        assert torch.equal(halves_sum(e), cols[0]), width


@needs_native
def test_a_forked_child_on_one_thread_encodes(tmp_path):
    # OpenMP cannot run parallel regions in a child forked after one (torch's own loops hang there too); a child
    # on one thread, as torch's DataLoader workers are, runs the C loops without OpenMP
    import os
    import signal

    codec = get_codec("int8")
    x = torch.randn(4 * native.MIN_PARALLEL, generator=torch.Generator().manual_seed(5))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        want = codec.encode(x)  # a parallel region in the parent
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # a hang ends at the alarm
            signal.alarm(30)
            try:
                torch.set_num_threads(1)
                (tmp_path / "child.bin").write_bytes(codec.encode(x).numpy().tobytes())
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
    finally:
        torch.set_num_threads(before)
    assert status == 0
    got = torch.frombuffer(bytearray((tmp_path / "child.bin").read_bytes()), dtype=torch.uint8)
    assert torch.equal(got, want)


@needs_native
def test_the_march_setting_builds_the_loops_for_that_cpu_into_a_file_of_their_own(tmp_path, monkeypatch):
    """``DILOCO_NATIVE_MARCH=x86-64`` (how the stress script runs the suite as an SSE2-only CPU would): the loops are
    built with that ``-march`` into a file of their own (this CPU's build is another), and give the reference's
    bytes."""
    if platform.machine() != "x86_64":
        pytest.skip("x86-64 -march values")
    built = []
    real_build = native._build
    monkeypatch.setattr(native, "_build", lambda cc, out, **kw: built.append(kw) or real_build(cc, out, **kw))
    monkeypatch.setenv(native.ENV_CACHE, str(tmp_path))
    x = torch.randn(5000, generator=torch.Generator().manual_seed(6))
    monkeypatch.setenv(native.ENV_MARCH, "x86-64")
    native.library.cache_clear()
    try:
        assert native.library() is not None
        for name in NATIVE:
            codec = get_codec(name)
            assert same_bits(codec.encode(x), codec.encode_reference(x)), name
            assert same_bits(codec.decode(codec.encode(x), 5000), codec.decode_reference(codec.encode(x), 5000)), name
    finally:
        native.library.cache_clear()
    assert built == [{"march": "x86-64"}]
    (so,) = tmp_path.glob("codecs-*.so")  # named by a key that holds the -march: this CPU's build is another file
    monkeypatch.delenv(native.ENV_MARCH)
    monkeypatch.setattr(native, "_build", lambda cc, out, **kw: built.append(out.name))
    native.library.cache_clear()
    try:
        native.library()  # (fails to load the file the spy did not build: a warning, None)
    finally:
        native.library.cache_clear()
    assert built[1] != so.name
