"""Regenerates fuzz/corpus/decode: small valid streams of every mode, each behind the harness's
control byte.  Run from the repository root after building the extension:

    PYTHONPATH=src python fuzz/make_corpus.py
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ckptzip import _native as N

OUT = Path(__file__).resolve().parent / "corpus" / "decode"


def fuzz_context(n: int, ctl: int) -> bytes:
    """fuzz_decode.c's fuzz_context for elements 0..n-1."""
    i = np.arange(n, dtype=np.uint64)
    return ((((i * 0x9E3779B1) & 0xFFFFFFFF) >> 28).astype(np.uint8) ^ ctl).tobytes()


def ctx_sample(data: bytes, ctl: int) -> tuple[int, bytes]:
    """A format-2 seed: elem_size 1 << ((ctl >> 2) & 3), rotate (ctl >> 4) % (8 elem_size)."""
    k = 1 << ((ctl >> 2) & 3)
    return ctl, N.encode_planes_ctx(data, fuzz_context(len(data) // k, ctl), k, (ctl >> 4) % (8 * k))


def samples() -> list[tuple[int, bytes]]:
    """(control byte, stream) pairs; the control byte's bits 2..4 give elem_size - 1."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal(2048) * 0.02).astype(np.float32)
    bf16 = (w.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    skew = (rng.geometric(0.3, 3000) + 60).astype(np.uint8).tobytes()
    low = np.where(rng.random(4096) < 0.9, 7, rng.integers(0, 4, 4096)).astype(np.uint8)
    noise = rng.integers(0, 256, 512, dtype=np.uint8).tobytes()
    return [
        (0x00, N.encode(b"")),
        (0x00, N.encode(b"z")),
        (0x00, N.encode(b"\x11" * 300)),  # CONST
        (0x00, N.encode(noise)),  # RAW
        (0x00, N.encode(skew)),  # HUFF
        (0x00, N.encode(low.tobytes())),  # RANS
        (0x04 | 0x20, N.encode_planes(bf16, 2, 1)),  # bf16 planes, rotate 1
        (0x0C | 0x20, N.encode_planes(w.tobytes(), 4, 1)),  # fp32 planes
        (0x1C, N.encode(bytes(range(256)) * 8, 8)),
        (0x04, N.encode(skew[:1500] + bytes(1500), 2)),
        ctx_sample(b"", 0x00),
        ctx_sample(skew, 0x00),  # one byte per element, one bucket
        ctx_sample(bf16 * 4, 0x14),  # bf16, rotate 1, several buckets
        ctx_sample(w.tobytes() * 3, 0x18),  # fp32 planes, RAW mantissas
        ctx_sample(low.tobytes() * 2, 0x0C),  # 8-byte elements, RANS
    ]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.iterdir():
        if not old.name.startswith("legacy-"):  # streams today's encoder no longer writes
            old.unlink()
    total = 0
    for ctl, stream in samples():
        blob = bytes([ctl]) + stream
        (OUT / hashlib.sha1(blob).hexdigest()[:16]).write_bytes(blob)
        total += len(blob)
    print(f"{len(samples())} seeds, {total} bytes in {OUT}")


if __name__ == "__main__":
    main()
