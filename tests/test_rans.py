"""RANS32 planes round trip through every encoder path: the register tables of the AVX-512
encoder (used values spanning at most 32, anywhere in 0..255, up to the top byte value) and
the gathers beyond that; the decoder is the format's reference."""

from __future__ import annotations

import numpy as np
import pytest

from ckptzip import _native

RANS32 = 4  # the segment mode byte (docs/STREAMS.md)


def first_mode(stream: bytes) -> int:
    """Mode byte of segment 0 of a format-1 stream: after the format byte and two varints."""
    at = 1
    for _ in range(2):
        while stream[at] & 0x80:
            at += 1
        at += 1
    return stream[at]


@pytest.mark.parametrize("span", [2, 5, 16, 31, 32, 33, 40, 64])
def test_skewed_planes_round_trip_at_every_offset(span: int) -> None:
    rng = np.random.default_rng(span)
    for first in (0, 1, 100, 255 - span + 1, 224):
        if first + span > 256:
            continue
        for n in (31, 32, 33, 4096, 100_003):
            # skewed, not dyadic (Huffman's codes waste bits on it): the segment is RANS32-coded
            weights = 0.3 ** np.arange(span, dtype=np.float64)
            symbols = rng.choice(span, size=n, p=weights / weights.sum()).astype(np.uint8)
            symbols[:2] = (0, span - 1)  # the whole span is used
            data = (symbols + np.uint8(first)).tobytes()
            stream = _native.encode(data)
            out = bytearray(n)
            _native.decode(stream, out)
            assert bytes(out) == data, (first, n)
            if n >= 100_000:  # long enough to repay the 128 bytes of rANS states
                assert first_mode(stream) == RANS32, (first, n)
