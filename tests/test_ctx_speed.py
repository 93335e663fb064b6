"""The context coder's fast paths give the same buckets and streams as the plain rule.

The native side counts a chunk's context histogram in a window of 16 values when a sample says
nearly all contexts fall there (the rest counted one by one), maps contexts to buckets through a
lookup table, and builds the decoder's bucket tables in blocks. None of that may change what
the bucket rule of docs/STREAMS.md ("Format 2", the bucket rule; "Format 3") gives: the bucket
count stored in the stream must be the one the rule computes from the full histogram, and every
stream must decode. These tests aim at the edges: contexts at the window's ends and just outside,
outliers in every position of a 64-byte block, lengths that are not multiples of 64, windows at
value 0 and 255, and spreads too wide for the window (the scalar path).
"""

from __future__ import annotations

import numpy as np
import pytest

from ckptzip import _native as N
from tests.test_ctx_format3 import format3_layout

MIN_BUCKET, MAX_BUCKETS = 2048, 32  # format constants (ctx.h)


def expected_buckets(ctx: np.ndarray) -> int:
    """The bucket rule: close a bucket once it holds max(MIN_BUCKET, ceil(n / MAX_BUCKETS))
    elements; a short tail joins the bucket before it."""
    n = ctx.size
    least = max(MIN_BUCKET, -(-n // MAX_BUCKETS))
    hist = np.bincount(ctx, minlength=256)
    b, size = 0, 0
    for count in hist:
        if count:
            size += int(count)
            if size >= least:
                b, size = b + 1, 0
    if size:
        b = max(b, 1)
    return b


def stored_buckets(enc: bytes) -> int:
    return format3_layout(enc)[1]


def check(ctx: np.ndarray, k: int = 2, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    n = ctx.size
    # a residual whose low byte depends on the bucket, so the bucketed tables get used
    data = (rng.geometric(0.05, n * k).astype(np.uint64) % 256).astype(np.uint8)
    low = data.reshape(n, k)[:, 0]
    data.reshape(n, k)[:, 0] = ((low.astype(np.uint16) + ctx) % 256).astype(np.uint8)
    enc = N.encode_planes_ctx(data.tobytes(), ctx.tobytes(), k, 0)
    assert stored_buckets(enc) == expected_buckets(ctx)
    out = bytearray(n * k)
    N.decode_planes_ctx(enc, ctx.tobytes(), out, k, 0)
    assert bytes(out) == data.tobytes()


@pytest.mark.parametrize("n", [4096, 4096 * 8 + 37, 65536, 131072 + 63, 262144])
@pytest.mark.parametrize("center", [0, 7, 120, 248, 255])
def test_concentrated_contexts_with_outliers(n: int, center: int) -> None:
    rng = np.random.default_rng(n + center)
    ctx = np.clip(np.rint(rng.normal(center, 2.5, n)), 0, 255).astype(np.uint8)
    # outliers at every offset of a 64-byte block, far away and just outside a 16-value window
    for off in range(64):
        for j in range(off, n, 64 * 97):
            ctx[j] = (center + (17 if off % 2 else 128) + off) % 256
    check(ctx, seed=n)


@pytest.mark.parametrize("lo", [0, 100, 240])
def test_window_edges(lo: int) -> None:
    n = 128 * 1024 + 5
    rng = np.random.default_rng(lo)
    ctx = (lo + rng.integers(0, 16, n)).astype(np.uint8)  # exactly a window
    check(ctx)
    ctx[rng.integers(0, n, 200)] = (lo - 1) % 256  # just below it
    ctx[rng.integers(0, n, 200)] = (lo + 16) % 256  # just above it
    check(ctx)


def test_wide_contexts_take_the_scalar_path() -> None:
    n = 200_000
    rng = np.random.default_rng(3)
    for ctx in (rng.integers(0, 256, n).astype(np.uint8),  # uniform: no window
                np.repeat(np.arange(64, dtype=np.uint8), -(-n // 64))[:n],  # sorted runs
                np.full(n, 77, np.uint8)):  # one value: one bucket
        check(ctx)


@pytest.mark.parametrize("k", [2, 4, 8])
def test_many_buckets_and_element_sizes(k: int) -> None:
    n = 65536 * 2
    rng = np.random.default_rng(k)
    ctx = rng.integers(100, 140, n).astype(np.uint8)  # ~40 values: up to 32 buckets
    check(ctx, k=k)


def test_context_bytes_every_width_and_rotation() -> None:
    rng = np.random.default_rng(5)
    for k, dtype in ((1, np.uint8), (2, np.uint16), (4, np.uint32), (8, np.uint64)):
        bits = 8 * k
        x = rng.integers(0, 2**bits, 1001, dtype=np.uint64).astype(dtype)
        for r in (0, 1, 3, bits - 1):
            wide = x.astype(object)
            rot = [((v << r) | (v >> ((bits - r) % bits))) & ((1 << bits) - 1) for v in wide]
            expected = bytes((v >> (bits - 8)) & 0xFF for v in rot)
            assert N.context_bytes(x.tobytes(), k, r) == expected


@pytest.mark.parametrize("outlier", [10, 99, 116, 250])
@pytest.mark.parametrize("extra", [0, 37])
def test_bucket_count_hangs_on_every_count(outlier: int, extra: int) -> None:
    """16 values with exactly MIN_BUCKET elements each close 16 buckets exactly, so one element
    miscounted anywhere (in the window or among the outliers) changes the stored count."""
    per = MIN_BUCKET
    ctx = np.repeat(np.arange(100, 116, dtype=np.uint8), per)
    order = np.random.default_rng(outlier + extra).permutation(ctx.size)
    if outlier < 100:
        ctx[:64] = outlier  # they come first in value order: still exactly per in bucket 0
    else:
        ctx[-64:] = outlier  # last in value order: bucket 15 still exactly per
    ctx = np.concatenate([ctx[order], np.full(extra, 255, np.uint8)])  # a short tail joins
    assert expected_buckets(ctx) == 16
    check(ctx)
