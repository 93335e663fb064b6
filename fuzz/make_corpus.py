"""Regenerates the libFuzzer seed corpora from real streams of today's encoder:

* fuzz/corpus/decode: small valid streams of every mode, each behind fuzz_decode.c's control byte;
* fuzz/corpus/delta: delta chunks as the writer makes them (a residual against a base, coded as
  byte planes or as context planes), each as fuzz_delta.c's control byte | u32 base length | base
  | stream.

Run from the repository root after building the extension (make_atheris_corpus.py makes the
atheris harnesses' seeds):

    PYTHONPATH=src python fuzz/make_corpus.py
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np

from ckptzip import _native as N

CORPUS = Path(__file__).resolve().parent / "corpus"
OUT = CORPUS / "decode"
#: codecs/context.py's CONTEXT_ROTATE; codecs/residual.py's kinds.
CONTEXT_ROTATE = 1
XOR, FLOAT_DIFF, INT_DIFF = 0, 1, 2


def fuzz_context(n: int, ctl: int) -> bytes:
    """fuzz_decode.c's fuzz_context for elements 0..n-1."""
    i = np.arange(n, dtype=np.uint64)
    return ((((i * 0x9E3779B1) & 0xFFFFFFFF) >> 28).astype(np.uint8) ^ ctl).tobytes()


def ctx_sample(data: bytes, ctl: int, fmt: int = N.CTX_STREAM_FORMAT) -> tuple[int, bytes]:
    """A context-planes seed (format 4, or 3 for 1-byte elements, many escapes or fmt=3):
    elem_size 1 << ((ctl >> 2) & 3), rotate (ctl >> 4) % (8 elem_size)."""
    k = 1 << ((ctl >> 2) & 3)
    return ctl, N.encode_planes_ctx(data, fuzz_context(len(data) // k, ctl), k,
                                    (ctl >> 4) % (8 * k), format=fmt)


def residual_words(n: int, k: int, rng: np.random.Generator) -> bytes:
    """Words whose top two bytes are mostly small, one in twelve 255 or more (format 4's
    escapes), the bytes under them noise."""
    top = np.minimum(rng.geometric(0.05, n), 254).astype(np.uint64)
    big = rng.random(n) < 1 / 12
    top[big] = rng.integers(255, 65536, int(big.sum()))
    words = top << np.uint64(8 * k - 16)
    if k > 2:
        words |= rng.integers(0, 1 << (8 * k - 16), n, dtype=np.uint64)
    return words.astype(np.dtype(f"<u{k}")).tobytes()


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
        ctx_sample(residual_words(6000, 2, rng), 0x04),  # format 4: HALVES, escapes
        ctx_sample(residual_words(3000, 4, rng), 0x08 | 0x30),  # format 4, fp32, rotate 3
        ctx_sample(residual_words(1500, 8, rng), 0x0C),  # format 4, 8-byte words
        ctx_sample(residual_words(6000, 2, rng), 0x04, fmt=3),  # format 3: two BUCKETED planes
        ctx_sample(bf16 * 4, 0x14, fmt=3),  # format 3, bf16, rotate 1
    ]


def delta_sample(new: bytes, base: bytes, kind: int, width: int, rotate: int, ctx: bool,
                 fmt: int = N.CTX_STREAM_FORMAT) -> bytes:
    """A fuzz_delta.c input: the residual of new against base, coded as the writer codes it
    (fmt=3: a context stream of the format the writer used before format 4)."""
    delta = bytearray(len(new))
    N.residual_encode(new, base, delta, width, kind)
    if ctx:
        stream = N.encode_planes_ctx(delta, N.context_bytes(base, width, CONTEXT_ROTATE), width,
                                     rotate, format=fmt)
    else:
        stream = N.encode_planes(bytes(delta), width, rotate)
    ctl = kind | (width.bit_length() - 1) << 2 | rotate << 4
    return bytes([ctl]) + struct.pack("<I", len(base)) + base + stream


def delta_samples() -> list[bytes]:
    rng = np.random.default_rng(1)
    w = (rng.standard_normal(1024) * 0.02).astype(np.float32)
    step = w - np.float32(1e-3) * np.sign(w) * (rng.random(1024) < 0.3).astype(np.float32)
    bf, bf_new = (x.view(np.uint32) >> 16 for x in (w, step))
    ids = rng.integers(0, 1000, 512, dtype=np.int64)
    return [
        delta_sample(b"", b"", XOR, 1, 0, False),
        delta_sample(step.tobytes(), w.tobytes(), FLOAT_DIFF, 4, 1, True),  # fp32, ctxplanes
        delta_sample(step.tobytes(), w.tobytes(), XOR, 4, 1, False),  # fp32, byteplanes
        delta_sample(bf_new.astype(np.uint16).tobytes(), bf.astype(np.uint16).tobytes(), FLOAT_DIFF,
                     2, 1, True),  # bf16, ctxplanes
        delta_sample((ids + 1).tobytes(), ids.tobytes(), INT_DIFF, 8, 0, True),  # int64 steps
        delta_sample(step.tobytes(), w.tobytes(), FLOAT_DIFF, 4, 0, True),  # fp32, the writer's
        delta_sample(bf_new.astype(np.uint16).tobytes(), bf.astype(np.uint16).tobytes(), FLOAT_DIFF,
                     2, 0, True),  # bf16 as the writer codes it (rotate 0): format 4
        delta_sample(bf_new.astype(np.uint16).tobytes(), bf.astype(np.uint16).tobytes(), FLOAT_DIFF,
                     2, 0, True, fmt=3),  # the same in format 3
        delta_sample((ids ^ 5).astype(np.uint8).tobytes(), ids.astype(np.uint8).tobytes(), XOR, 1,
                     0, False),
    ]


def write_seeds(out: Path, blobs: list[bytes], keep_legacy: bool = False) -> None:
    """Replace out's seeds by blobs, named by content (``legacy-*`` seeds stay when asked)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if not (keep_legacy and old.name.startswith("legacy-")):
            old.unlink()
    for blob in blobs:
        (out / hashlib.sha1(blob).hexdigest()[:16]).write_bytes(blob)
    print(f"{len(blobs)} seeds, {sum(map(len, blobs))} bytes in {out}")


def main() -> None:
    # legacy-*: streams today's encoder no longer writes
    write_seeds(OUT, [bytes([ctl]) + stream for ctl, stream in samples()], keep_legacy=True)
    write_seeds(CORPUS / "delta", delta_samples())


if __name__ == "__main__":
    main()
