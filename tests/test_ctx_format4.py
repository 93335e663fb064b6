"""Context stream format 4 (``encode_planes_ctx``, written now): the top two bytes of each word as
one symbol in its bucket's table, the values from 255 up as escapes; bucketed planes in halves.

Roundtrips for every width, rotation and awkward length; the switch to format 3 when over a
quarter of the elements escape; every stored field a decoder reads (bucket starts, the halves'
lengths, escape values) refused when wrong; the same streams from every kernel level (CKZ_CPU);
and the ratio next to format 3 (docs/STREAMS.md, "Format 4").
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from ckptzip import _native as N
from tests.test_ctx_format3 import bf16_delta, fp32_delta, varint

FORMAT4, FORMAT3 = 0x04, 0x03
RAW, CONST, RANS32, BUCKETED, HALVES = 0, 1, 4, 5, 6


def roundtrip(data: bytes, ctx: bytes, k: int, r: int) -> bytes:
    enc = N.encode_planes_ctx(data, ctx, k, r)
    assert N.decoded_size(enc) == len(data)
    out = bytearray(len(data))
    N.decode_planes_ctx(enc, ctx, out, k, r)
    assert bytes(out) == data
    return enc


def residual_like(n: int, k: int, seed: int, escape_rate: float = 0.05) -> tuple[bytes, bytes]:
    """Words whose top two bytes are mostly small (geometric, by context) with a share of larger
    values (escapes), the rest of the word noise; and a context of a few exponent-like values."""
    rng = np.random.default_rng(seed)
    ctx = rng.integers(110, 126, n).astype(np.uint8)
    top = np.minimum(rng.geometric(0.02 + (ctx % 5) * 0.04), 254).astype(np.uint64)
    big = rng.random(n) < escape_rate
    top[big] = rng.integers(255, 65536, int(big.sum()))
    words = top << np.uint64(8 * k - 16)
    if k > 2:
        words |= rng.integers(0, 1 << (8 * k - 16), n, dtype=np.uint64)
    return words.astype(np.dtype(f"<u{k}")).tobytes(), ctx.tobytes()


def window_edges(n: int, span: int, k: int, seed: int = 7) -> tuple[bytes, bytes]:
    """Residual-like words whose context makes four buckets, starting at 0, 91, 100 and
    91 + span, with elements at the values next to those starts and at the extremes.  The AVX2
    bucket index looks the starts up in a window of 31 values from the first start's neighbour
    below, and span 30 is the widest it takes (31 falls back to compare passes; both must give
    the same buckets).  A bucket closes on its large value (docs/STREAMS.md, the bucket rule)."""
    rng = np.random.default_rng(seed)
    large = [90, 95, 90 + span, 91 + span]  # the last value of buckets 0-2, the first of 3
    small = [0, 4, 91, 92, 100, 92 + span, 255]  # 91 and 100 open buckets 1 and 2
    ctx = np.repeat(np.array(large, np.uint8), -(-n // len(large)))[:n]
    ctx[rng.choice(n, 40 * len(small), replace=False)] = np.repeat(np.array(small, np.uint8), 40)
    top = np.minimum(rng.geometric(0.02 + (ctx % 7) * 0.03), 254).astype(np.uint64)
    words = top << np.uint64(8 * k - 16)
    if k > 2:
        words |= rng.integers(0, 1 << (8 * k - 16), n, dtype=np.uint64)
    return words.astype(np.dtype(f"<u{k}")).tobytes(), ctx.tobytes()


def header_end(enc: bytes) -> int:
    """Position after a format-4 header: format, n varint, elem_size, B varint, B - 1 starts."""
    pos = 1
    while enc[pos] & 0x80:
        pos += 1
    pos += 2
    buckets = enc[pos]  # < 128: one byte
    return pos + 1 + max(buckets - 1, 0)


@pytest.mark.parametrize("k", [2, 4, 8])
@pytest.mark.parametrize("n", [0, 1, 2, 15, 16, 63, 64, 65, 127, 4097, 70_001])
def test_roundtrip_widths_rotations_lengths(k: int, n: int) -> None:
    data, ctx = residual_like(n, k, seed=n + k)
    for r in sorted({0, 1, 8 * k - 1}):
        enc = roundtrip(data, ctx, k, r)
        if r == 0:
            assert enc[0] == FORMAT4 or (n == 0 and enc[0] in (FORMAT4, FORMAT3))


def test_one_byte_words_stay_format3() -> None:
    ctx = bytes(range(200)) * 50
    assert roundtrip(bytes(10_000), ctx, 1, 0)[0] == FORMAT3


def test_more_than_a_quarter_escaping_is_written_in_format3() -> None:
    n = 8192
    rng = np.random.default_rng(1)
    ctx = rng.integers(0, 40, n).astype(np.uint8).tobytes()
    for escapes, expected in ((n // 4, FORMAT4), (n // 4 + 1, FORMAT3)):
        words = rng.integers(0, 255, n).astype(np.uint16)
        words[rng.permutation(n)[:escapes]] = rng.integers(255, 65536, escapes)
        assert roundtrip(words.tobytes(), ctx, 2, 0)[0] == expected, escapes


def test_escape_values_at_the_edges() -> None:
    values = [0, 1, 254, 255, 256, 510, 511, 0xFF00, 0xFFFE, 0xFFFF]
    for n in (10, 64 * 3 + 5, 5000):  # scalar, vector steps and a tail, larger
        words = np.resize(np.array([3, 7, 0, 1] * 4 + values, np.uint16), n)
        if np.count_nonzero(words >= 255) * 4 > n:
            words[np.flatnonzero(words >= 255)[n // 8 :]] = 9
        enc = roundtrip(words.tobytes(), bytes(n), 2, 0)
        assert enc[0] == FORMAT4


def test_bucketed_symbol_plane_is_in_halves() -> None:
    data, ctx = bf16_delta(131_072, 0, 2e-4)
    for r in (0, 1):
        enc = roundtrip(data, ctx, 2, r)
        assert enc[0] == FORMAT4 and enc[header_end(enc)] == HALVES


def test_ratio_within_a_percent_of_format3() -> None:
    for data, ctx, k in ((*bf16_delta(131_072, 0, 2e-4), 2), (*bf16_delta(131_072, 1, 1e-3), 2),
                         (*fp32_delta(65_536, 3), 4)):
        four = len(N.encode_planes_ctx(data, ctx, k, 0))
        three = len(N.encode_planes_ctx(data, ctx, k, 0, format=FORMAT3))
        assert four <= three * 1.01, (four, three)


def stream4(n: int, k: int, starts: bytes, planes: bytes) -> bytes:
    buckets = len(starts) + 1 if n else 0
    return bytes([FORMAT4]) + varint(n) + bytes([k]) + varint(buckets) + starts + planes


def test_escape_values_past_16_bits_are_refused() -> None:
    for n in (4, 64, 200):  # the scalar loop, one vector step, steps and a tail
        planes = bytes([CONST, 255, RAW]) + bytes([1]) * n + bytes([RAW]) + bytes([255]) * n
        with pytest.raises(ValueError, match="escape value exceeds"):
            N.decode_planes_ctx(stream4(n, 2, b"", planes), bytes(n), bytearray(2 * n), 2, 0)
        # 255 + 0xff00 = 0xffff fits: the same stream with low bytes 0 decodes
        ok = bytes([CONST, 255, RAW]) + bytes(n) + bytes([RAW]) + bytes([255]) * n
        out = bytearray(2 * n)
        N.decode_planes_ctx(stream4(n, 2, b"", ok), bytes(n), out, 2, 0)
        assert out == b"\xff\xff" * n
        with pytest.raises(ValueError, match="escape value exceeds"):  # the planes' path (k = 4)
            wide = bytes([CONST, 0, CONST, 0]) + planes
            N.decode_planes_ctx(stream4(n, 4, b"", wide), bytes(n), bytearray(4 * n), 4, 0)


def test_one_escape_past_16_bits_is_refused_anywhere() -> None:
    """One escape value too large among many that fit (255 + 0xff00 = 0xffff), early (the
    vector kernels' steps) or last (the one-by-one tail): refused wherever it falls."""
    n = 200
    for k in (2, 4):
        for pos in (0, 37, 100, n - 1):
            lo = bytearray(n)
            lo[pos] = 1  # 255 + 0xff01 passes 16 bits
            planes = bytes([CONST, 0]) * (k - 2) + bytes([CONST, 255, RAW]) + bytes(lo)
            planes += bytes([RAW]) + bytes([255]) * n
            with pytest.raises(ValueError, match="escape value exceeds"):
                N.decode_planes_ctx(stream4(n, k, b"", planes), bytes(n), bytearray(k * n), k, 0)


def test_chunks_that_nearly_all_escape() -> None:
    """Every element, or all but a few, escapes: the encoder's vector steps stop packing escapes
    before its planes' end and the chunk goes to format 3; it round-trips."""
    rng = np.random.default_rng(11)
    for k in (2, 4):
        for n in (64, 1000, 5003):
            words = rng.integers(255, 65536, n).astype(np.uint32)
            words[rng.permutation(n)[:5]] = 3
            if k == 2:
                data = words.astype(np.uint16).tobytes()
            else:
                data = ((words << 16) | rng.integers(0, 65536, n).astype(np.uint32)).tobytes()
            enc = roundtrip(data, bytes(n), k, 0)
            assert enc[0] == FORMAT3


def test_stored_fields_are_checked() -> None:
    n = 5000
    ctx = bytes(n)
    out = bytearray(2 * n)
    body = bytes([CONST, 3, RAW, RAW])  # symbol 3 everywhere, no escapes
    N.decode_planes_ctx(stream4(n, 2, b"\x10", body), ctx, out, 2, 0)
    assert out == b"\x03\x00" * n
    with pytest.raises(ValueError, match="not above"):
        N.decode_planes_ctx(stream4(n, 2, b"\x10\x10", body), ctx, out, 2, 0)
    with pytest.raises(ValueError, match="not above"):
        N.decode_planes_ctx(stream4(n, 2, b"\x00", body), ctx, out, 2, 0)
    with pytest.raises(ValueError, match="buckets for"):
        N.decode_planes_ctx(bytes([FORMAT4]) + varint(n) + b"\x02\x00" + body, ctx, out, 2, 0)
    with pytest.raises(ValueError, match="bucket starts"):
        N.decode_planes_ctx(stream4(n, 2, b"\x10\x20", b"")[:-1], ctx, out, 2, 0)
    with pytest.raises(ValueError, match="trailing"):
        N.decode_planes_ctx(stream4(n, 2, b"", body + b"\x00"), ctx, out, 2, 0)
    with pytest.raises(ValueError, match="2 bytes or more"):
        N.decode_planes_ctx(stream4(n, 1, b"", body), ctx, bytearray(n), 1, 0)
    with pytest.raises(ValueError, match="unknown mode"):  # BUCKETED belongs to format 3
        N.decode_planes_ctx(stream4(n, 2, b"", bytes([BUCKETED, 0]) + body[2:]), ctx, out, 2, 0)
    with pytest.raises(ValueError, match="unknown mode"):  # escapes are coded order 0
        N.decode_planes_ctx(stream4(n, 2, b"", bytes([CONST, 3, HALVES])), ctx, out, 2, 0)


def test_halves_first_length_is_checked() -> None:
    data, ctx = bf16_delta(20_000, 2, 2e-4)
    enc = N.encode_planes_ctx(data, ctx, 2, 0)
    start = header_end(enc)
    assert enc[start] == HALVES
    # the body length varint, then the unit, the bucket tables, then the first half's length:
    # find it by trying every position after the body length for a varint that overruns
    broken = 0
    for pos in range(start + 3, min(len(enc), start + 600)):
        bad = bytearray(enc)
        bad[pos : pos + 3] = b"\xff\xff\x7f"
        try:
            N.decode_planes_ctx(bytes(bad), ctx, bytearray(len(data)), 2, 0)
        except ValueError as exc:
            broken += "first half" in str(exc)
    assert broken >= 1


def test_damage_gives_an_error_or_other_bytes_never_a_crash() -> None:
    data, ctx = residual_like(3000, 2, seed=7, escape_rate=0.1)
    enc = N.encode_planes_ctx(data, ctx, 2, 0)
    rng = np.random.default_rng(0)
    for cut in range(len(enc)):
        with pytest.raises(ValueError):
            N.decode_planes_ctx(enc[:cut], ctx, bytearray(len(data)), 2, 0)
    for _ in range(400):
        bad = bytearray(enc)
        for pos in rng.integers(0, len(enc), 3):
            bad[pos] ^= int(rng.integers(1, 256))
        out = bytearray(len(data))
        try:
            N.decode_planes_ctx(bytes(bad), ctx, out, 2, 0)
        except ValueError:
            continue
    other = bytes(reversed(ctx))  # another context: other buckets, still no crash
    with contextlib.suppress(ValueError):
        N.decode_planes_ctx(enc, other, bytearray(len(data)), 2, 0)


CPU_CHILD = """
import hashlib, sys
import numpy as np
sys.path[:0] = {paths!r}
from ckptzip import _native as N
from tests.test_ctx_format3 import bf16_delta, fp32_delta
from tests.test_ctx_format4 import residual_like, window_edges
h = hashlib.sha256()
cases = [(*bf16_delta(70_001, 0, 2e-4), 2), (*fp32_delta(40_000, 3), 4),
         (*residual_like(20_000, 2, 5, 0.2), 2), (*residual_like(9_999, 8, 6), 8),
         (*window_edges(65_536, 30, 2), 2), (*window_edges(65_536, 31, 4), 4),
         (*window_edges(65_539, 31, 2), 2)]
for data, ctx, k in cases:
    for r in (0, 1):
        enc = N.encode_planes_ctx(data, ctx, k, r)
        out = bytearray(len(data))
        N.decode_planes_ctx(enc, ctx, out, k, r)
        assert bytes(out) == data
        h.update(enc)
for n, k in ((100, 2), (100, 4)):  # an escape past 16 bits, refused on every path
    planes = bytes([1, 255, 0]) + bytes([1]) * n + bytes([0]) + bytes([255]) * n
    stream = bytes([4, n, k, 1]) + bytes([1, 0]) * (k - 2) + planes
    try:
        N.decode_planes_ctx(stream, bytes(n), bytearray(k * n), k, 0)
        raise SystemExit("accepted")
    except ValueError as exc:
        assert "escape value exceeds" in str(exc), exc
print(h.hexdigest())
"""


def test_every_kernel_level_writes_and_reads_the_same_streams() -> None:
    """CKZ_CPU caps the kernels (baseline SSE2, AVX2, AVX-512 without VBMI2, everything): the
    escapes' byte compress and expand, the word kernels, the bucket index, the halves and the
    tables agree byte for byte."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [os.path.join(root, "src"), root]
    digests = set()
    for level in ("baseline", "v3", "v4", "all"):
        env = dict(os.environ, CKZ_CPU=level)
        run = subprocess.run([sys.executable, "-c", CPU_CHILD.format(paths=paths)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        digests.add(run.stdout.strip())
    assert len(digests) == 1


#: (length, sha256 prefix) of format 4's stream of bf16_delta(131_072, 0, 2e-4), rotate 1.  (It
#: was 65,273 bytes while format 4 still tried the units 2^3 and 2^2 as format 3 does.)
PINNED = (65_240, "dd3c738ae21a4842d9ed3c22da25a4e2")


def test_encoder_output_pinned() -> None:
    """The writer is deterministic: a fixed input gives one stream, pinned here when format 4
    was written (a change of its layout or policy must show up here and in docs/STREAMS.md).
    The same input in format 3 is 64,975 bytes (test_ctx_format3's pin "bf16_a")."""
    data, ctx = bf16_delta(131_072, 0, 2e-4)
    enc = N.encode_planes_ctx(data, ctx, 2, 1)
    assert enc[0] == FORMAT4
    assert (len(enc), hashlib.sha256(enc).hexdigest()[:32]) == PINNED
