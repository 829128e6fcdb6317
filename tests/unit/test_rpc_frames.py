"""The learner-to-syncer frames (:mod:`diloco.decoupled.rpc.frames`): every message comes back bit for bit, its bytes
are the payload's plus a small header, and bytes that are not a frame are refused, never unpickled."""

from __future__ import annotations

import math

import pytest
import torch

from diloco.decoupled.messages import Reply, Report, Welcome
from diloco.decoupled.rpc.frames import (
    FrameError,
    pack,
    pack_reply,
    pack_report,
    pack_welcome,
    unpack,
    unpack_reply,
    unpack_report,
    unpack_welcome,
)
from diloco.wire.registry import get_codec


@pytest.mark.parametrize("codec", ["fp32", "bf16", "fp4_e2m1", "int8"])
def test_a_report_and_its_reply_come_back_bit_for_bit_with_a_small_header(codec):
    x = torch.randn(10_001, generator=torch.Generator().manual_seed(0))
    x[7] = math.nan  # a non-finite contribution travels as the codec made it (the syncer drops it)
    payload = get_codec(codec).encode(x)
    report = Report(3, 1, payload, steps=8, tokens=4096.0, step_time=0.123, sent_after_step=40, base_version=5)
    frame = pack_report(report, syncer="s", shard=0)
    header, tensors = unpack(frame)
    back = unpack_report(header, tensors)
    assert torch.equal(back.payload.view(torch.uint8), payload.view(torch.uint8))
    assert (back.learner, back.fragment, back.steps, back.tokens, back.step_time) == (3, 1, 8, 4096.0, 0.123)
    assert (back.sent_after_step, back.base_version) == (40, 5)
    assert len(payload) < len(frame) <= len(payload) + 300  # the codec's bytes and a header, no text floats
    reply = unpack_reply(pack_reply(Reply(3, 1, payload, version=6, trained=99)))
    assert torch.equal(reply.payload, payload) and (reply.version, reply.trained) == (6, 99)
    assert unpack_reply(pack_reply(None)) is None


def test_a_welcome_comes_back_bit_for_bit():
    frags = [torch.randn(5), torch.randn(0), torch.randn(3).to(torch.bfloat16)]
    back = unpack_welcome(pack_welcome(Welcome(frags, [1, 0, 2], incarnation=3, step=17)))
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(frags, back.fragments, strict=True))
    assert (back.versions, back.incarnation, back.step) == ([1, 0, 2], 3, 17)


def test_what_is_not_a_frame_is_refused():
    good = pack({"a": 1}, [torch.ones(4)])
    for bad in (b"GET / HTTP/1.1\r\n\r\n", good[:-1], good + b"x", b"DLC1\x00\x00\x00\x02{x"):
        with pytest.raises(FrameError):
            unpack(bad)
    with pytest.raises(ValueError):  # strict JSON: a NaN scalar is not sent
        pack({"step_time": math.nan})
