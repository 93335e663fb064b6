"""Tests of the native core ``ckptzip._native``: byte planes, the entropy stage, CRC-32C.

Round trips over random and adversarial inputs, fused == composed byte for byte, and a hostile
decoder: every truncation and random corruption of valid streams must raise ValueError or decode
to some output, never crash.  The libFuzzer smoke run is skipped where clang is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptzip import _native as N

ROOT = Path(__file__).resolve().parents[1]
ELEM_ROTATE = [(k, r) for k in (1, 2, 3, 4, 8, 16) for r in sorted({0, 1, 7, 8 * k - 1, 4 * k})]


def roundtrip(data: bytes, segments: int = 1) -> bytes:
    enc = N.encode(data, segments)
    assert N.decoded_size(enc) == len(data)
    out = bytearray(len(data))
    N.decode(enc, out)
    assert bytes(out) == data
    return enc


def split(data: bytes, k: int, r: int) -> bytes:
    out = bytearray(len(data))
    N.split_planes(data, out, k, r)
    return bytes(out)


def ref_split(data: bytes, k: int, r: int) -> bytes:
    """Python model of split_planes: rotate each little-endian word left, then byte p to plane p."""
    n, bits = len(data) // k, 8 * k
    planes = bytearray(len(data))
    for i in range(n):
        w = int.from_bytes(data[i * k : (i + 1) * k], "little")
        w = ((w << r) | (w >> (bits - r))) & ((1 << bits) - 1) if r else w
        for p, b in enumerate(w.to_bytes(k, "little")):
            planes[p * n + i] = b
    return bytes(planes)


def skewed(n: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return (rng.geometric(0.35, n) + 100).astype(np.uint8).tobytes()


def bf16_like(n: int, seed: int = 0) -> bytes:
    """Normal weights cast to bf16: the realistic exponent distribution."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(n) * 0.02).astype(np.float32)
    return (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()


# ---- crc32c -------------------------------------------------------------------------------------


def test_crc32c_check_values() -> None:
    assert N.crc32c(b"123456789") == 0xE3069283
    assert N.crc32c(b"") == 0
    assert N.crc32c(bytes(32)) == 0x8A9136AA  # RFC 3720 B.4 test vectors
    assert N.crc32c(b"\xff" * 32) == 0x62A8AB43
    assert N.crc32c(bytes(range(32))) == 0x46DD794E


@given(st.binary(max_size=20000), st.integers(0, 20000))
@settings(max_examples=200, deadline=None)
def test_crc32c_chains(data: bytes, cut: int) -> None:
    cut = min(cut, len(data))
    assert N.crc32c(data[cut:], N.crc32c(data[:cut])) == N.crc32c(data)


def test_crc32c_long_and_unaligned() -> None:
    data = np.random.default_rng(1).integers(0, 256, 100_003, dtype=np.uint8).tobytes()
    whole = N.crc32c(data)
    for cut in (1, 3, 7, 4096 * 3 + 5, 50_000):
        assert N.crc32c(memoryview(data)[cut:], N.crc32c(data[:cut])) == whole
    assert N.crc32c(np.frombuffer(data, np.uint8)) == whole


# ---- byte planes --------------------------------------------------------------------------------

def _quarter_counts(data: np.ndarray) -> list[list[int]]:
    n, q = len(data), -(-len(data) // 4)
    return [np.bincount(data[min(k * q, n) : min((k + 1) * q, n)], minlength=256).tolist()
            for k in range(4)]


@pytest.mark.parametrize("n", [4096, 4159, 100_003, 262_144])
@pytest.mark.parametrize("lo", [0, 117, 240, 250])
def test_byte_histogram_is_exact_on_exponent_like_bytes(n: int, lo: int) -> None:
    """Bytes within a window of 16 values (exponent planes) are counted by vector compares,
    the rest one by one: every count must still be exact, in every quarter, up to the tails."""
    rng = np.random.default_rng(n + lo)
    data = (lo + rng.integers(0, 16, n)).clip(0, 255).astype(np.uint8)
    outliers = np.concatenate([rng.integers(0, n, n // 100), np.arange(max(n - 70, 0), n, 7),
                               [0, n // 4, n // 4 - 1, n - 1]])
    data[outliers] = rng.integers(0, 256, len(outliers))
    counts = N.byte_histogram(data)
    assert [list(row) for row in counts] == _quarter_counts(data)
    assert sum(map(sum, counts)) == n


@pytest.mark.parametrize("value", [0, 128, 255])
def test_byte_histogram_is_exact_on_one_repeated_byte(value: int) -> None:
    """One value throughout: a vector counter's byte accumulators take a hit in every lane at
    every step, so they must be summed before 256 steps (a wrap would lose 256 per lane)."""
    data = np.full(1_000_003, value, np.uint8)
    data[[5, 500_000, 999_999]] = (value + 100) % 256
    assert [list(row) for row in N.byte_histogram(data)] == _quarter_counts(data)


@pytest.mark.parametrize("n", [0, 1, 63, 4095, 70_000])
def test_byte_histogram_is_exact_on_spread_bytes(n: int) -> None:
    data = np.random.default_rng(n).integers(0, 256, n).astype(np.uint8)
    assert [list(row) for row in N.byte_histogram(data)] == _quarter_counts(data)


@pytest.mark.parametrize(("k", "r"), ELEM_ROTATE)
def test_split_matches_model_and_merge_inverts(k: int, r: int) -> None:
    rng = np.random.default_rng(k * 100 + r)
    for n in (0, 1, 5, 33, 257):
        data = rng.integers(0, 256, n * k, dtype=np.uint8).tobytes()
        planes = split(data, k, r)
        assert planes == ref_split(data, k, r)
        back = bytearray(len(data))
        N.merge_planes(planes, back, k, r)
        assert bytes(back) == data


def test_bf16_rotation_puts_exponent_in_high_plane() -> None:
    w = np.array([1.0, -2.0, 0.5], np.float32)
    bf = (w.view(np.uint32) >> 16).astype(np.uint16)
    planes = split(bf.tobytes(), 2, 1)
    assert list(planes[3:]) == [127, 128, 126]  # biased exponents
    assert list(planes[:3]) == [0, 1, 0]  # sign in the low bit, mantissa above


def test_plane_argument_errors() -> None:
    with pytest.raises(ValueError, match="rotate"):
        N.split_planes(b"ab", bytearray(2), 2, 16)
    with pytest.raises(ValueError, match="elem_size"):
        N.split_planes(b"ab", bytearray(2), 0, 0)
    with pytest.raises(ValueError, match="multiple"):
        N.split_planes(b"abc", bytearray(3), 2, 0)
    with pytest.raises(ValueError, match="differs"):
        N.merge_planes(b"ab", bytearray(4), 2, 0)
    buf = bytearray(8)
    with pytest.raises(ValueError, match="overlap"):
        N.split_planes(buf, buf, 2, 1)
    with pytest.raises(TypeError):
        N.split_planes(b"ab", b"xy", 2, 1)  # read-only dst


# ---- entropy stage ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"x",
        b"\x00" * 100_000,
        b"ab" * 50_000,
        bytes(range(256)) * 400,
        skewed(1),
        skewed(7),
        skewed(100_001),
        np.random.default_rng(2).integers(0, 256, 300_000, dtype=np.uint8).tobytes(),
        bytes([0] * 99_999 + [255]),  # a 1-in-100000 symbol: exercises the length limit
    ],
    ids=lambda d: f"len{len(d)}",
)
def test_encode_roundtrip_fixed(data: bytes) -> None:
    roundtrip(data)


def test_modes_and_ratio() -> None:
    assert len(N.encode(b"\x07" * 1000)) < 10  # CONST
    noise = np.random.default_rng(3).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
    assert len(N.encode(noise)) <= len(noise) + 16  # RAW, not expanded
    sk = skewed(100_000)
    assert len(roundtrip(sk)) < 0.4 * len(sk)  # coded


@given(st.binary(max_size=5000), st.integers(1, 8))
@settings(max_examples=300, deadline=None)
def test_encode_roundtrip_random(data: bytes, segments: int) -> None:
    data = data[: len(data) - len(data) % segments]
    roundtrip(data, segments)


@given(
    st.lists(st.integers(0, 255), min_size=1, max_size=6),
    st.integers(0, 40_000),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=150, deadline=None)
def test_encode_roundtrip_small_alphabets(alphabet: list[int], n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    weights = rng.random(len(alphabet)) ** 4 + 1e-3
    data = rng.choice(np.array(alphabet, np.uint8), n, p=weights / weights.sum()).tobytes()
    roundtrip(data, 1)


@pytest.mark.parametrize(("k", "r"), ELEM_ROTATE)
def test_fused_equals_composed(k: int, r: int) -> None:
    rng = np.random.default_rng(k + 17 * r)
    for n_elems in (0, 1, 3, 1000, 70_001):
        n_bytes = n_elems * k
        if k == 2:
            data = bf16_like(n_elems, seed=r)
        else:
            data = rng.integers(0, 256, n_bytes, dtype=np.uint8).tobytes()
            head = bytes(b & 0x0F if i % k == k - 1 else b for i, b in enumerate(data[:4000]))
            data = head + data[4000:]
        fused = N.encode_planes(data, k, r)
        assert fused == N.encode(split(data, k, r), k)
        out = np.empty(n_bytes, np.uint8)
        N.decode_planes(fused, out, k, r)
        assert out.tobytes() == data


def test_bf16_planes_compress() -> None:
    data = bf16_like(500_000)
    enc = N.encode_planes(data, 2, 1)
    assert len(data) / len(enc) > 1.45


def test_decode_argument_errors() -> None:
    enc = N.encode(b"hello world!", 2)
    with pytest.raises(ValueError, match="destination"):
        N.decode(enc, bytearray(5))
    with pytest.raises(ValueError, match="segments"):
        N.decode_planes(enc, bytearray(12), 3, 0)
    with pytest.raises(ValueError, match="multiple"):
        N.encode(b"abc", 2)
    with pytest.raises(ValueError, match="segments"):
        N.encode(b"", 0)


# ---- rANS segments ------------------------------------------------------------------------------

# A mode-3 (4-stream rANS) segment as the encoder wrote it before RANS32 replaced it: 3000 symbols
# of legacy_rans_data().  The decoder keeps reading such streams, and small segments are written
# in this layout again (N.RANS_SMALL_LIMIT): the encoder must reproduce it to the byte.
LEGACY_RANS_STREAM = bytes.fromhex(
    "01b8170103970200074d58810174000000e61c4e3a40d28590002b6e44a9498b20ee7e41ab8af39c479b15c7"
    "823118d6111fe490fbc602c53cd3fa37302b3ba8dd386830ab44334bfbee2e3b640f50b0156debf46a7c385b"
    "a33c34204458fdfac294ef859fca0300cb5d31576e808752e337e1c955b3b6791b48e0010982a212d6b489c4"
    "7d168e53a247d98038cf5eed5d060dcd991c04e72b077dbdad5c958103004cf6ee85059547a5df0afab0e27f"
    "fbf5c30894c376eb9f4a911f89abb5704a10743a824c5dcf5ad01bbb93f8c91917c368b405120d938e2e43f7"
    "6dafd5a33c2d742d32e3b27c8ef794010d04ad567e5727fe3b9b0f39275a2e8f1a59417782e9d24d4a11d2f8"
    "c5ca142690769d97496fdd799f55f33e7fc44d793bc8"
)


def legacy_rans_data() -> bytes:
    out, r = bytearray(), 12345
    for _ in range(3000):
        r = (r * 1103515245 + 12345) & 0xFFFFFFFF
        v = (r >> 16) % 100
        out.append(7 if v < 90 else v % 4)
    return bytes(out)


def test_legacy_rans_stream_decodes() -> None:
    assert LEGACY_RANS_STREAM[4] == 3  # one segment, mode RANS
    out = bytearray(3000)
    N.decode(LEGACY_RANS_STREAM, out)
    assert bytes(out) == legacy_rans_data()
    assert roundtrip(legacy_rans_data()) == LEGACY_RANS_STREAM  # the same encoder, to the byte
    for cut in range(len(LEGACY_RANS_STREAM)):
        with pytest.raises(ValueError):
            N.decode(LEGACY_RANS_STREAM[:cut], bytearray(3000))


def segment_modes(enc: bytes) -> list[int]:
    """The segment modes of a format-1 stream (its header: format, n, S, then each segment's mode
    and value byte or body length)."""
    def varint(pos: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = enc[pos]
            value |= (byte & 0x7F) << shift
            pos, shift = pos + 1, shift + 7
            if not byte & 0x80:
                return value, pos
    _, pos = varint(1)
    count, pos = varint(pos)
    modes = []
    for _ in range(count):
        modes.append(enc[pos])
        pos += 1
        if modes[-1] == 1:
            pos += 1
        elif modes[-1] >= 2:
            _, pos = varint(pos)
    return modes


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 100, 3072, 4095, 4096, 65_536])
def test_small_segments_take_the_four_stream_layout(n: int) -> None:
    """A low-entropy segment of fewer than 4096 symbols is written as RANS (16 bytes of states,
    some quarters empty when n < 4), a longer one as RANS32 (128): the small layout must pay for
    itself against RANS32's, which the stream without it would have been."""
    assert N.RANS_SMALL_LIMIT == 4096
    rng = np.random.default_rng(n)
    data = np.where(rng.random(n) < 0.75, 0, rng.integers(1, 4, n)).astype(np.uint8)
    data[: min(n, 2)] = [0, 1][: min(n, 2)]
    enc = roundtrip(data.tobytes())
    modes = segment_modes(enc)
    if n >= 3072:  # at 4096 Huffman beats RANS32's 128 state bytes; at 65536 RANS32 wins
        assert modes == [3 if n < N.RANS_SMALL_LIMIT else 2 if n == 4096 else 4]
    if modes == [3]:
        counts = np.bincount(data, minlength=4)
        entropy = sum(-c * np.log2(c / n) for c in counts if c) / 8
        assert len(enc) < entropy + 40  # RANS32 alone spends 128 bytes on its states
    for segments in (2, 4):  # several small segments, each with its own layout
        cut = n - n % segments
        roundtrip(data[:cut].tobytes(), segments)


def test_small_segments_round_trip_whatever_their_statistics() -> None:
    """Random small segments (2 to 40 symbols of any skew, anywhere in the byte range, 1 to 4
    segments) decode to what was coded, and the RANS layout comes up among them."""
    rng = np.random.default_rng(23)
    modes: set[int] = set()
    for _ in range(400):
        n = int(rng.integers(0, 2 * N.RANS_SMALL_LIMIT))
        k = int(rng.integers(2, 41))
        p = rng.dirichlet(np.full(k, float(rng.choice([0.1, 0.5, 2.0]))))
        data = (rng.choice(k, size=n, p=p) + int(rng.integers(0, 256 - k))).astype(np.uint8)
        segments = int(rng.choice([1, 2, 4]))
        enc = roundtrip(data[: n - n % segments].tobytes(), segments)
        if n >= segments:
            modes.update(segment_modes(enc))
    assert {3, 4} <= modes


@pytest.mark.parametrize("n", [1, 31, 32, 33, 1000, 65_536, 300_001])
def test_rans32_lanes_and_tails(n: int) -> None:
    """Low entropy: a few words cover thousands of symbols, so the decoder's padded tail and its
    scalar remainder (n % 32 symbols) both run."""
    rng = np.random.default_rng(n)
    data = np.where(rng.random(n) < 0.998, 9, rng.integers(0, 3, n)).astype(np.uint8)
    data[: min(n, 2)] = [0, 1][: min(n, 2)]
    enc = roundtrip(data.tobytes())
    if n >= 65_536:  # the only segment is RANS32 (short ones take RANS or HUFF: fewer state bytes)
        assert segment_modes(enc) == [4]


# ---- context-bucketed planes (encode_planes_ctx) -------------------------------------------------

CTX_ELEM_ROTATE = [(k, r) for k in (1, 2, 4, 8) for r in sorted({0, 1, 8 * k - 1})]


def ctx_roundtrip(data: bytes, ctx: bytes, k: int, r: int) -> bytes:
    enc = N.encode_planes_ctx(data, ctx, k, r)
    # format 4; format 3 for 1-byte elements and for chunks where over 1/4 of the elements escape
    assert enc[0] == (N.CTX_STREAM_FORMAT if k > 1 and escapes(data, k, r) * 4 <= len(ctx) else 3)
    assert N.decoded_size(enc) == len(data)
    out = bytearray(len(data))
    N.decode_planes_ctx(enc, ctx, out, k, r)
    assert bytes(out) == data
    return enc


def escapes(data: bytes, k: int, r: int) -> int:
    """Elements whose top two bytes, after rotating each element left by r bits, hold 255 or
    more: format 4 codes them as escapes."""
    words = np.frombuffer(data, np.dtype(f"<u{k}")).astype(np.uint64)
    bits = np.uint64(8 * k)
    rotated = ((words << np.uint64(r)) | (words >> ((bits - np.uint64(r)) % bits))) if r else words
    if k < 8:
        rotated &= np.uint64((1 << (8 * k)) - 1)
    return int(np.count_nonzero((rotated >> np.uint64(8 * k - 16)) >= 255))


def ctx_bucket_count(enc: bytes) -> int:
    """The stored bucket count: after the format byte, the element-count varint, elem_size."""
    pos = 1
    while enc[pos] & 0x80:
        pos += 1
    return enc[pos + 2]  # < 128: a one-byte varint


def bf16_delta(n: int, seed: int = 0) -> tuple[bytes, bytes]:
    """(float-diff residual, base exponent context) of bf16 weights after a small update whose
    size in ulps depends on the weight's exponent, as in real training."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(n) * 0.02).astype(np.float32)
    new = w + rng.standard_normal(n).astype(np.float32) * 2e-4
    base16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    new16 = (new.view(np.uint32) >> 16).astype(np.uint16)
    delta = np.empty_like(base16)
    N.residual_encode(new16, base16, delta, 2, 1)
    return delta.tobytes(), N.context_bytes(base16, 2, 1)


@pytest.mark.parametrize(("k", "r"), CTX_ELEM_ROTATE)
def test_context_bytes_is_the_top_plane(k: int, r: int) -> None:
    data = np.random.default_rng(k + r).integers(0, 256, 1001 * k, dtype=np.uint8).tobytes()
    assert N.context_bytes(data, k, r) == split(data, k, r)[1001 * (k - 1) :]


@pytest.mark.parametrize(("k", "r"), CTX_ELEM_ROTATE)
def test_ctx_roundtrip_sizes(k: int, r: int) -> None:
    rng = np.random.default_rng(3 * k + r)
    for n in (0, 1, 3, 2047, 2048, 2049, 4097, 70_001):
        data = rng.integers(0, 256, n * k, dtype=np.uint8)
        data[k - 1 :: k] &= 0x07  # a compressible top byte
        for ctx in (bytes(n), rng.integers(0, 256, n, dtype=np.uint8).tobytes()):
            ctx_roundtrip(data.tobytes(), ctx, k, r)


@given(
    st.sampled_from(CTX_ELEM_ROTATE),
    st.integers(0, 30_000),
    st.integers(1, 256),
    st.integers(0, 2**32 - 1),
)
@settings(max_examples=120, deadline=None)
def test_ctx_roundtrip_random(kr: tuple[int, int], n: int, spread: int, seed: int) -> None:
    k, r = kr
    rng = np.random.default_rng(seed)
    ctx = (rng.geometric(1 / spread, n) % 256).astype(np.uint8).tobytes()
    data = rng.integers(0, 256, n * k, dtype=np.uint8)
    data[:: max(1, int(rng.integers(1, 5)))] = 0
    enc = ctx_roundtrip(data.tobytes(), ctx, k, r)
    assert ctx_bucket_count(enc) <= 32


def test_ctx_beats_plain_planes_on_deltas() -> None:
    delta, ctx = bf16_delta(200_000)
    plain = len(N.encode_planes(delta, 2, 1))
    assert len(ctx_roundtrip(delta, ctx, 2, 1)) < 0.97 * plain


def test_ctx_buckets_bounded() -> None:
    rng = np.random.default_rng(9)
    n = 1 << 20
    ctx = (np.arange(n) % 256).astype(np.uint8).tobytes()
    enc = ctx_roundtrip(rng.integers(0, 4, n, dtype=np.uint8).tobytes(), ctx, 1, 0)
    assert ctx_bucket_count(enc) == 32  # 4096 elements per value: 8 values per n / 32
    assert ctx_bucket_count(ctx_roundtrip(bytes(5000), ctx[:5000], 1, 0)) == 2  # >= 2048 each


def test_ctx_argument_errors() -> None:
    delta, ctx = bf16_delta(10_000)
    enc = N.encode_planes_ctx(delta, ctx, 2, 1)
    out = bytearray(len(delta))
    with pytest.raises(ValueError, match="ctx holds"):
        N.encode_planes_ctx(delta, ctx[:-1], 2, 1)
    with pytest.raises(ValueError, match="1, 2, 4 or 8"):
        N.encode_planes_ctx(delta[:9999], ctx[:3333], 3, 1)
    with pytest.raises(ValueError, match="1, 2, 4 or 8"):
        N.context_bytes(delta, 16, 1)
    with pytest.raises(ValueError, match="context holds"):
        N.decode_planes_ctx(enc, ctx[:-2], bytearray(len(delta) - 4), 2, 1)
    with pytest.raises(ValueError, match="destination"):
        N.decode_planes_ctx(enc, ctx, bytearray(len(delta) + 2), 2, 1)
    with pytest.raises(ValueError, match="elem_size"):
        N.decode_planes_ctx(enc, ctx + ctx, out, 1, 0)
    with pytest.raises(ValueError, match="buckets"):  # format 3 recomputes the buckets
        enc3 = N.encode_planes_ctx(delta, ctx, 2, 1, format=3)
        N.decode_planes_ctx(enc3, bytes(len(ctx)), out, 2, 1)  # another context's buckets
    with pytest.raises(ValueError, match="is not 4 or 3"):
        N.encode_planes_ctx(delta, ctx, 2, 1, format=2)
    with pytest.raises(ValueError, match="format byte"):
        N.decode_planes_ctx(N.encode_planes(delta, 2, 1), ctx, out, 2, 1)
    with pytest.raises(ValueError, match="format byte"):
        N.decode(enc, out)
    with pytest.raises(ValueError, match="element count"):
        N.decoded_size(b"\x02\x80\x80\x80\x80\x10\x01\x00")  # 2^32 elements
    with pytest.raises(ValueError, match="bucket count"):
        N.decode_planes_ctx(b"\x02\x01\x01\x21", b"\x00", bytearray(1), 1, 0)  # 33 > 32
    buf = memoryview(bytearray(enc + bytes(len(delta))))
    with pytest.raises(ValueError, match="overlaps"):
        N.decode_planes_ctx(buf[: len(enc)], ctx, buf[len(enc) - 1 :][: len(delta)], 2, 1)


def try_decode_ctx(stream: bytes, ctx: bytes, k: int) -> None:
    out = bytearray(len(ctx) * k)
    with contextlib.suppress(ValueError):
        N.decode_planes_ctx(stream, ctx, out, k, 1)


def test_ctx_truncation_and_corruption() -> None:
    rng = np.random.default_rng(6)
    delta, ctx = bf16_delta(9000, seed=4)
    ctx4 = rng.integers(0, 3, 3000, np.uint8).tobytes()
    cases = [
        (N.encode_planes_ctx(delta, ctx, 2, 1), ctx, 2),
        (N.encode_planes_ctx(skewed(12_000), ctx4, 4, 1), ctx4, 4),
    ]
    for stream, c, k in cases:
        for cut in range(len(stream)):
            with pytest.raises(ValueError):
                N.decode_planes_ctx(stream[:cut], c, bytearray(len(c) * k), k, 1)
        with pytest.raises(ValueError, match="trailing"):
            N.decode_planes_ctx(stream + b"\x00", c, bytearray(len(c) * k), k, 1)
        for _ in range(300):
            buf = bytearray(stream)
            for pos in rng.integers(0, len(buf), int(rng.integers(1, 4))):
                buf[pos] = int(rng.integers(0, 256))
            try_decode_ctx(bytes(buf), c, k)


# ---- hostile input ------------------------------------------------------------------------------


def sample_streams() -> list[tuple[bytes, int]]:
    """(stream, elem_size) pairs covering every mode and several segment counts."""
    return [
        (N.encode(skewed(3000)), 1),
        (N.encode(b"\x05" * 64 + skewed(64), 2), 2),
        (N.encode_planes(bf16_like(2000), 2, 1), 2),
        (N.encode(bytes(range(256)) * 4, 4), 4),
    ]


def try_decode(stream: bytes, k: int) -> None:
    """Decoding must raise ValueError or succeed; either way the process survives."""
    try:
        n = N.decoded_size(stream)
    except ValueError:
        return
    if n > 1 << 24:
        return
    for fn in (lambda out: N.decode(stream, out), lambda out: N.decode_planes(stream, out, k, 1)):
        out = bytearray(n)
        with contextlib.suppress(ValueError):
            fn(out)


def test_every_truncation_raises() -> None:
    for stream, k in sample_streams():
        for cut in range(len(stream)):
            with pytest.raises(ValueError):
                N.decode(stream[:cut], bytearray(N.decoded_size(stream)))
            try_decode(stream[:cut], k)
        with pytest.raises(ValueError, match="trailing"):
            N.decode(stream + b"\x00", bytearray(N.decoded_size(stream)))


def test_random_corruption_never_crashes() -> None:
    rng = np.random.default_rng(5)
    for stream, k in sample_streams():
        for _ in range(400):
            buf = bytearray(stream)
            for pos in rng.integers(0, len(buf), int(rng.integers(1, 4))):
                buf[pos] = int(rng.integers(0, 256))
            try_decode(bytes(buf), k)


@given(st.binary(max_size=300))
@settings(max_examples=500, deadline=None)
def test_garbage_never_crashes(blob: bytes) -> None:
    try_decode(b"\x01" + blob, 2)
    try_decode(blob, 1)


def test_header_validation_messages() -> None:
    with pytest.raises(ValueError, match="empty"):
        N.decoded_size(b"")
    with pytest.raises(ValueError, match="format byte"):
        N.decoded_size(b"\x09\x00\x01")
    with pytest.raises(ValueError, match="segment count"):
        N.decoded_size(b"\x01\x04\x00")
    with pytest.raises(ValueError, match="not a multiple"):
        N.decoded_size(b"\x01\x05\x02\x00\x00")
    with pytest.raises(ValueError, match="unknown mode"):
        N.decoded_size(b"\x01\x01\x01\x07")
    with pytest.raises(ValueError, match="minimal"):
        N.decoded_size(b"\x01\x81\x00\x01\x00")


# ---- fuzz smoke ---------------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("clang") is None, reason="clang (libFuzzer) not installed")
def test_fuzz_smoke(tmp_path: Path) -> None:
    res = subprocess.run(
        ["make", "-C", str(ROOT / "fuzz"), "smoke", f"BUILD={tmp_path / 'build'}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def read_varint(data: bytes, at: int) -> tuple[int, int]:
    """(value, bytes used) of the varint at ``at``."""
    value = shift = used = 0
    while True:
        byte = data[at + used]
        value |= (byte & 0x7F) << shift
        used, shift = used + 1, shift + 7
        if not byte & 0x80:
            return value, used


def huff_quarter_sizes_at(stream: bytes) -> int:
    """Where a one-segment HUFF stream's varint size0 begins (STREAMS.md, "Stream" and "HUFF")."""
    at = 1 + read_varint(stream, 1)[1]  # format, n
    at += read_varint(stream, at)[1]  # S
    assert stream[at] == 2, "HUFF"
    at += 1 + read_varint(stream, at + 1)[1]  # mode, body length
    count = stream[at + 1] + 1  # u8 first, u8 count - 1, then the 4-bit lengths
    return at + 2 + (count + 1) // 2


def flat_codes_stream(bits: int, n: int, seed: int) -> tuple[bytes, bytes]:
    """(data, stream): n bytes over 2**bits values in equal numbers (the last few aside), so the
    Huffman code gives every value a code of `bits` bits: the decoder's fixed-width path (an
    Adam exp_avg_sq's low mantissa byte beside its constant sign bit is such a plane)."""
    rng = np.random.default_rng(seed)
    values = rng.choice(256, 1 << bits, replace=False).astype(np.uint8)
    data = np.resize(values, n)
    rng.shuffle(data)
    return data.tobytes(), N.encode(data.tobytes(), 1)


@pytest.mark.parametrize("bits", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("groups", [1, 3, 37, 64, 129, 1000, 4099])
def test_fixed_width_huffman_codes_roundtrip(bits: int, groups: int) -> None:
    """Every quarter's length (multiples of 64 codes, of 8, and tails) through the vector steps,
    the 8-code groups and the code-by-code rest."""
    data, stream = flat_codes_stream(bits, groups << bits, seed=groups + bits)
    if groups >= 37:  # smaller ones go RAW: the table outweighs the gain
        huff_quarter_sizes_at(stream)  # HUFF, every length `bits`
        assert len(stream) < len(data) * bits / 8 + 200
    out = bytearray(len(data))
    N.decode(stream, out)
    assert out == data


def test_fixed_width_huffman_streams_are_checked_as_any_other() -> None:
    data, stream = flat_codes_stream(7, 128 * 600, seed=9)
    out = bytearray(len(data))
    for cut in (len(stream) - 1, len(stream) - 57, len(stream) // 2, 12):
        with pytest.raises(ValueError):
            N.decode(stream[:cut], out)
    with pytest.raises(ValueError, match="trailing"):
        N.decode(stream + b"\x00", out)
    # quarter sizes moved by a byte each way: the same total, two streams of the wrong size
    at = huff_quarter_sizes_at(stream)
    size0, used0 = read_varint(stream, at)
    size1, used1 = read_varint(stream, at + used0)
    moved = stream[:at] + varint(size0 + 1) + varint(size1 - 1) + stream[at + used0 + used1:]
    assert len(moved) == len(stream)
    with pytest.raises(ValueError, match="huffman stream 0"):
        N.decode(moved, out)


def test_fixed_width_huffman_streams_are_the_generic_coders() -> None:
    """Flat planes of 2 to 128 values code to the streams the generic Huffman coder wrote before
    the fixed-width path existed (digest from commit 0e95b8a), tails and padding included."""
    h = hashlib.sha256()
    rng = np.random.default_rng(0)
    for bits in range(1, 8):
        values = rng.choice(256, 1 << bits, replace=False).astype(np.uint8)
        for n in (1000, 4096 * 3 + 5, 100_000):
            data = np.resize(values, n)
            rng.shuffle(data)
            h.update(N.encode(data.tobytes(), 1))
    assert h.hexdigest()[:32] == "65db0afcab1f09ce8b2ebdcc44bb9139"
