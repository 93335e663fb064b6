"""Tests of the native core ``ckptzip._native``: byte planes, the entropy stage, CRC-32C.

Round trips over random and adversarial inputs, fused == composed byte for byte, and a hostile
decoder: every truncation and random corruption of valid streams must raise ValueError or decode
to some output, never crash.  The libFuzzer smoke run is skipped where clang is missing.
"""

from __future__ import annotations

import contextlib
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
