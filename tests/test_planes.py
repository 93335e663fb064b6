"""split_planes / merge_planes against a numpy reference for 2- and 4-byte elements, every
rotation and lengths around the vector kernels' steps (AVX-512 VBMI takes 64 elements a step,
AVX2 32; the portable loop does the tails)."""

from __future__ import annotations

import numpy as np
import pytest

from ckptzip import _native

LENGTHS = (0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 1000, 4096 + 17)


@pytest.mark.parametrize(("width", "dtype"), [(2, np.uint16), (4, np.uint32)])
def test_planes_match_the_reference(width: int, dtype: type) -> None:
    rng = np.random.default_rng(width)
    bits = 8 * width
    mask = (1 << bits) - 1
    for n in LENGTHS:
        x = rng.integers(0, 1 << bits, n, dtype=np.uint64).astype(dtype)
        wide = x.astype(np.uint64)
        for rotate in range(bits):
            rotated = ((wide << np.uint64(rotate)) | (wide >> np.uint64((bits - rotate) % bits))
                       if rotate else wide) & np.uint64(mask)
            expected = np.concatenate(
                [((rotated >> np.uint64(8 * p)) & np.uint64(255)).astype(np.uint8)
                 for p in range(width)])
            planes = np.empty(n * width, np.uint8)
            _native.split_planes(x.view(np.uint8), planes, width, rotate)
            assert np.array_equal(planes, expected), (n, rotate)
            back = np.empty(n * width, np.uint8)
            _native.merge_planes(planes, back, width, rotate)
            assert np.array_equal(back, x.view(np.uint8)), (n, rotate)
