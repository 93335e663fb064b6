"""CRC-32C against a bitwise reference, over every code path: the software tables, the crc32
instruction's three chains, and carry-less folding for long buffers (crc32c.c)."""

from __future__ import annotations

import numpy as np

from ckptzip import _native

_TABLE = []
for _byte in range(256):
    _c = _byte
    for _ in range(8):
        _c = (_c >> 1) ^ (0x82F63B78 if _c & 1 else 0)
    _TABLE.append(_c)


def reference(data: bytes, value: int = 0) -> int:
    crc = value ^ 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_check_value() -> None:
    assert _native.crc32c(b"123456789") == 0xE3069283
    assert _native.crc32c(b"") == 0


def test_every_length_and_alignment_around_the_fold_boundaries() -> None:
    rng = np.random.default_rng(7)
    data = rng.integers(0, 256, 80_000, dtype=np.uint8).tobytes()
    lengths = [*range(0, 70), *range(240, 272), *range(500, 530), *range(760, 780), 1024,
               4095, 4096, 4097, 12_345, 3 * 4096 * 2 + 5, 65_536 + 77, 79_000]
    for length in lengths:
        for offset in (0, 1, 3, 8, 63):
            piece = data[offset : offset + length]
            value = int(rng.integers(0, 2**32))
            assert _native.crc32c(piece, value) == reference(piece, value), (length, offset)


def test_chaining_equals_one_pass() -> None:
    data = np.random.default_rng(8).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    whole = _native.crc32c(data)
    for cut in (1, 255, 256, 511, 512, 4096, 600_001):
        assert _native.crc32c(data[cut:], _native.crc32c(data[:cut])) == whole
    assert whole == reference(data)
