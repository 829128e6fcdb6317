"""Codec inputs that the C loops' and the Triton kernels' tests share: blocks chosen to catch a changed
summation order, a changed tie and a missing subnormal scale (each caught such a change in one of them)."""

from __future__ import annotations

import torch

#: 16-value blocks (fp32 bits, two lines a block) whose candidate search picks another scale when the block error is
#: summed in an order other than halves first (adjacent pairs; left to right; adjacent pairs, then halves; fours left
#: to right, then halves), for E2M1 or E3M0: found by a random search over 50M N(0, 1) blocks per format (each block's
#: absmax 3, so that together they keep their tensor scale).
ORDER_SENSITIVE = (
    "40400000 bf167f6c 3e7ad934 bfb9cab1 401aef2b bfdc82e8 3f58f5ab 3f384393",
    "bf298dfb 3e1aa98e be47ca3b 3ef2cc5c bee0e89c 3f86da8c 3fb31a3d be8f3021",
    "40400000 bf1effe1 bf5edc79 3f288710 bf227789 40400000 bfde3af9 bf97619d",
    "bf191b1f 3f9b2c4b be8c9bf1 bf83129c 3fb65ea6 3fdaffd4 3f518cc0 bf6da663",
    "40400000 bfdc4b0f be6584fa 3ec65520 3f80dde5 be865cbb 3fa72363 3ec5985b",
    "bf950cb7 be423a16 3e3f8e7f 3fc6a9fa 3fe05db9 bf03da08 bf91b6c1 bf98acc2",
    "40400000 3d411cfa bf312d85 3e5225e3 bf18d517 bdc4b4b1 3fd9b0d1 3e40a8b9",
    "3c345890 3f9156b9 bea7658b 3f8e162b 3e8f4f2a bf0f0d9e bfd7675e 3fb1087a",
    "40400000 3d866dc3 3f851e78 3fea310e be80597d bfbdfc65 bf7b46f7 3fe6ac8e",
    "3dd88d12 3c25a887 c00278b9 3d8ca677 bfde929b 3f848fb2 bfc37fcb bd191b8c",
    "40400000 3e579b0f bfcda5f9 3eb02f7c 3f853c99 3fec5e1d bf116e17 bff3efed",
    "bf4ae7f7 bf931f2d bee1fc75 bf7f9727 3fa965ec 40149802 3e07b6c7 3e933a50",
    "40400000 3f9427d8 bf96a892 3ff09502 bfbfa586 c00df313 befc77c9 beface0a",
    "bcd546db bee808ab bf961275 3dcbcd0c bf86bda4 3f26e5c2 3ec9dff6 beb5f5a3",
    "40400000 3fcc44b5 3fafc27e 4035f512 be189255 be6cc4cf bf0f283a 3f36c20f",
    "3f67c8a0 3fd2f47d 3d1c253e 3ecb4515 3f601126 bfea71c4 be9c1410 bedbcec3",
    "40400000 3ffca630 3f6d7427 3fdf7b2c 3f96b2a7 3f699816 3d523bde bf8d7ba5",
    "3f1e7020 bdef8d8f 3f6515f3 3f9a9afc 3f50dfdf c016cff9 bf816b54 3e0fcd4e",
)


def order_sensitive_blocks() -> torch.Tensor:
    words = [int(w, 16) for w in " ".join(ORDER_SENSITIVE).split()]
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32).view(torch.float32)


def uniform_ties() -> torch.Tensor:
    """Blocks of one rounding midpoint of E2M1 or E3M0 under a top value (6 or 16) times an E4M3 scale: the largest
    candidate scale is that E4M3 value, so every element of the block lies on a midpoint at it and (the rest of the
    block agreeing) that candidate wins; the native cases mix midpoints in a block, where it rarely does."""
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.125, 0.1875, 0.375, 1.5, 3.0, 12.0]
    scales = torch.tensor([1, 7, 8, 9, 40, 64, 100, 126], dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    blocks = [
        torch.tensor([top] + [mid] * 15) * sign * scale
        for mid in mids
        for top in (6.0, 16.0)
        for scale in scales.tolist()
        for sign in (1.0, -1.0)
    ]
    return torch.cat(blocks)


def graded_blocks() -> torch.Tensor:
    """Blocks whose absmax falls from the tensor's to 2^-26 of it: normal, subnormal (below about 2^-14) and zero
    (below about 2^-22 or 2^-25) E4M3 block scales, and every step between."""
    g = torch.Generator().manual_seed(4)
    return (torch.randn(256, 16, generator=g) * torch.logspace(0, -26, 256, base=2).unsqueeze(1)).flatten()
