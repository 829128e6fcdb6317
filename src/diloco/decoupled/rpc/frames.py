"""The learner-to-syncer messages as bytes: a strict-JSON header of the scalars, then each tensor's raw bytes.

A frame is ``b"DLC1"``, the header's length (4 bytes, big-endian), the header (UTF-8 JSON, no NaN) and the
tensors' bytes one after another; the header lists each tensor's dtype and shape under ``"tensors"``. A report's
and a reply's payloads are the codecs' ``uint8`` bytes as they are, a welcome's fragments their FP32 bytes: nothing
is pickled (a frame from the network is read as data only) and no float becomes text, so what the syncer merges
is what the learner encoded, bit for bit, and the bytes on the wire are the payload's plus a header of ~100 bytes.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any

import torch

from diloco.decoupled.messages import Reply, Report, Welcome

MAGIC = b"DLC1"
_DTYPES = {
    str(d).removeprefix("torch."): d for d in (torch.uint8, torch.int8, torch.float32, torch.bfloat16, torch.float16)
}


class FrameError(ValueError):
    """Bytes that are not a frame of this protocol (another program on the port, or a cut message)."""


def pack(header: dict[str, Any], tensors: list[torch.Tensor] = ()) -> bytes:  # type: ignore[assignment]
    """``header`` (JSON-able, finite floats) and ``tensors`` (CPU, any of the dtypes above) as one frame."""
    blobs, shapes = [], []
    for t in tensors:
        t = t.detach().to("cpu").contiguous()
        name = str(t.dtype).removeprefix("torch.")
        assert name in _DTYPES, f"a {t.dtype} tensor has no frame format"
        shapes.append([name, list(t.shape)])
        blobs.append(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    text = json.dumps({**header, "tensors": shapes}, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return b"".join([MAGIC, struct.pack(">I", len(text)), text, *blobs])


def unpack(data: bytes) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """A frame's header and tensors (each its own copy); FrameError for anything else."""
    if len(data) < 8 or data[:4] != MAGIC:
        raise FrameError(f"not a diloco frame (starts {bytes(data[:8])!r})")
    (n,) = struct.unpack(">I", data[4:8])
    try:
        header = json.loads(data[8 : 8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"a frame's header is not JSON ({exc})") from None
    tensors, at = [], 8 + n
    for name, shape in header.pop("tensors", []):
        if name not in _DTYPES:
            raise FrameError(f"a frame's tensor has dtype {name!r}, which this protocol does not carry")
        dtype = _DTYPES[name]
        numel = 1
        for s in shape:
            numel *= int(s)
        size = numel * torch.empty((), dtype=dtype).element_size()
        if at + size > len(data):
            raise FrameError(f"a frame is cut short ({len(data)} bytes, its tensors need {at + size})")
        raw = (
            torch.frombuffer(bytearray(data[at : at + size]), dtype=torch.uint8)
            if size
            else torch.empty(0, dtype=torch.uint8)
        )
        tensors.append(raw.view(dtype).reshape(shape))
        at += size
    if at != len(data):
        raise FrameError(f"a frame has {len(data) - at} bytes after its tensors")
    return header, tensors


# -- the messages ------------------------------------------------------------
def pack_report(report: Report, *, syncer: str, shard: int, session: str | None = None) -> bytes:
    fields = {k: getattr(report, k) for k in ("learner", "fragment", "steps", "sent_after_step", "base_version")}
    # a step time that is not finite is no step time (the syncer reads only one > 0): strict JSON carries 0.0
    step_time = float(report.step_time) if math.isfinite(report.step_time) else 0.0
    scalars = {"tokens": float(report.tokens), "step_time": step_time}
    claim = {} if session is None else {"session": session}  # the job's claim: a lost one's reports are refused
    return pack({"syncer": syncer, "shard": shard, **fields, **scalars, **claim}, [report.payload])


def unpack_report(header: dict[str, Any], tensors: list[torch.Tensor]) -> Report:
    (payload,) = tensors
    return Report(
        learner=int(header["learner"]),
        fragment=int(header["fragment"]),
        payload=payload,
        steps=int(header["steps"]),
        tokens=float(header["tokens"]),
        step_time=float(header["step_time"]),
        sent_after_step=int(header["sent_after_step"]),
        base_version=int(header["base_version"]),
    )


def pack_reply(reply: Reply | None) -> bytes:
    if reply is None:
        return pack({"reply": None})
    fields = {"learner": reply.learner, "fragment": reply.fragment, "version": reply.version, "trained": reply.trained}
    return pack({"reply": fields}, [reply.payload])


def unpack_reply(data: bytes) -> Reply | None:
    header, tensors = unpack(data)
    if header["reply"] is None:
        return None
    return Reply(payload=tensors[0], **{k: int(v) for k, v in header["reply"].items()})


def pack_welcome(welcome: Welcome) -> bytes:
    head = {"versions": list(welcome.versions), "incarnation": welcome.incarnation, "step": welcome.step}
    return pack(head, list(welcome.fragments))


def unpack_welcome(data: bytes) -> Welcome:
    header, tensors = unpack(data)
    return Welcome(
        fragments=tensors,
        versions=[int(v) for v in header["versions"]],
        incarnation=int(header["incarnation"]),
        step=int(header["step"]),
    )


__all__ = [
    "FrameError",
    "pack",
    "pack_reply",
    "pack_report",
    "pack_welcome",
    "unpack",
    "unpack_reply",
    "unpack_report",
    "unpack_welcome",
]
