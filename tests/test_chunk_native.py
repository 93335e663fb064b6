"""One-call chunk coding (``_native.encode_chunk/decode_chunk``, docs/STREAMS.md "Implementation
notes"): the same streams as the pipeline's stages one by one, exact sizes without writing, for
every pipeline a writer tries against a base (dense included) on real-ish and random data."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from ckptzip import _native as N
from ckptzip import dtypes
from ckptzip.codecs import ContextPlanes
from ckptzip.codecs.context import CONTEXT_ROTATE
from ckptzip.errors import CorruptError
from ckptzip.pipeline import Pipeline
from ckptzip.policy import LosslessPolicy
from tests.test_ctx_format3 import format3_layout
from tests.test_native import segment_modes


def candidates(dtype: torch.dtype) -> list[Pipeline]:
    leaf = SimpleNamespace(dtype=dtypes.from_torch(dtype, "t"), name="t")
    policy = LosslessPolicy()
    return [policy.pipeline_for(leaf), *policy.delta_candidates(leaf)]  # type: ignore[arg-type]


def staged(p: Pipeline, raw: bytes, base: bytes) -> bytes:
    """The stream as the stages code it one by one (what encode_chunk did before it fused)."""
    data: object = raw
    if p.residual is not None:
        data = p.residual.encode(raw, base)
    if isinstance(p.serializer, ContextPlanes):
        ctx = N.context_bytes(base, p.serializer.width, CONTEXT_ROTATE)
        return N.encode_planes_ctx(data, ctx, p.serializer.width, p.serializer.rotate)
    segments = 1
    if p.serializer is not None:
        data, segments = p.serializer.encode(data), p.serializer.segments()  # type: ignore[arg-type]
    for c in p.compressors:
        data, segments = c.encode(data, segments), 1  # type: ignore[arg-type]
    return bytes(data)  # type: ignore[call-overload]


def pair(dtype: torch.dtype, n: int, kind: str, seed: int = 0) -> tuple[bytes, bytes]:
    """(new, base) raw bytes: weights after a small update, or random bits."""
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        size = n * torch.empty((), dtype=dtype).element_size()
        return (torch.randint(0, 256, (size,), generator=g, dtype=torch.uint8).numpy().tobytes(),
                torch.randint(0, 256, (size,), generator=g, dtype=torch.uint8).numpy().tobytes())
    if not dtype.is_floating_point:
        b = torch.randint(-100, 100, (n,), generator=g).to(dtype)
        a = b + torch.randint(-2, 3, (n,), generator=g).to(dtype)
    else:
        w = torch.randn(n, generator=g) * 0.02
        b = w.to(dtype)
        a = (w + torch.randn(n, generator=g) * 2e-4).to(dtype)
    return a.numpy().tobytes() if dtype != torch.bfloat16 else a.view(torch.int16).numpy().tobytes(), \
        b.numpy().tobytes() if dtype != torch.bfloat16 else b.view(torch.int16).numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int8,
                                   torch.int32, torch.float64])
@pytest.mark.parametrize("kind", ["weights", "random"])
@pytest.mark.parametrize("n", [0, 1, 777, 40_000, 70_001])
def test_sizes_and_streams_match_the_stages(dtype: torch.dtype, kind: str, n: int) -> None:
    raw, base = pair(dtype, n, kind, seed=n)
    for p in candidates(dtype):
        b = base if p.residual is not None else None
        ref = staged(p, raw, base)
        assert p.encode_chunk(raw, b) == ref, p.get_config()
        assert p.encoded_size(raw, b) == len(ref), p.get_config()
        out = bytearray(len(raw))
        p.decode_chunk(ref, out, b)
        assert out == raw, p.get_config()


def test_decode_chunk_refuses_corrupt_streams() -> None:
    raw, base = pair(torch.bfloat16, 5000, "weights")
    for p in candidates(torch.bfloat16)[1:]:
        good = p.encode_chunk(raw, base)
        out = bytearray(len(raw))
        for bad in (good[:-1], good + b"\0", good[:3]):
            with pytest.raises(CorruptError):
                p.decode_chunk(bad, out, base)
        with pytest.raises(ValueError):
            p.decode_chunk(good, out, None)


def test_native_chunk_arguments_checked() -> None:
    raw, base = pair(torch.float32, 100, "weights")
    with pytest.raises(ValueError):
        N.encode_chunk(raw, base, 3, 0, 1, -1)  # width
    with pytest.raises(ValueError):
        N.encode_chunk(raw, base, 4, 32, 1, -1)  # rotate
    with pytest.raises(ValueError):
        N.encode_chunk(raw, None, 4, 0, -1, 1)  # a context without a residual
    with pytest.raises(ValueError):
        N.encode_chunk(raw, None, 4, 0, 1, 1)  # no base
    with pytest.raises(ValueError):
        N.encode_chunk(raw, base[:-4], 4, 0, 1, 1)  # base length
    with pytest.raises(ValueError):
        N.encode_chunk(raw[:-1], base[:-1], 4, 0, 1, 1)  # ragged
    out = bytearray(len(raw))
    with pytest.raises(ValueError):
        N.decode_chunk(b"", base, out, 4, 0, 1, 7)


def test_trials_pick_what_full_coding_picks() -> None:
    """The writer's size-only trials choose what coding every candidate chose (same sizes)."""
    for dtype in (torch.float32, torch.bfloat16):
        raw, base = pair(dtype, 32768, "weights", seed=3)
        sized = [p.encoded_size(raw, base if p.residual else None) for p in candidates(dtype)]
        coded = [len(p.encode_chunk(raw, base if p.residual else None)) for p in candidates(dtype)]
        assert sized == coded


def test_two_bucketed_planes_report_the_first_error() -> None:
    """Two BUCKETED planes decode together, but errors come in plane order, as plane by plane."""
    raw, base = pair(torch.bfloat16, 60_000, "weights")
    p = candidates(torch.bfloat16)[-1]
    assert isinstance(p.serializer, ContextPlanes) and p.residual is not None
    # a format-3 stream (format 4 has one bucketed plane, in two halves)
    good = N.encode_planes_ctx(p.residual.encode(raw, base), p.serializer._context(base), 2, 0,
                               format=3)
    planes = format3_layout(good)[2]
    assert [m for m, _, _ in planes] == [5, 5]
    (_, _, e0), (_, s1, _) = planes
    out = bytearray(len(raw))
    table1 = bytearray(good)
    table1[s1] = 7  # plane 1's frequency unit 2^7: refused while its tables are read
    with pytest.raises(CorruptError, match="plane 1"):
        p.decode_chunk(bytes(table1), out, base)
    both = bytearray(table1)
    both[e0 - 200] ^= 0x55  # plane 0's rANS words too: its error comes first
    with pytest.raises(CorruptError, match="rans32"):
        p.decode_chunk(bytes(both), out, base)
    stream1 = bytearray(good)
    stream1[len(good) - 150] ^= 0x55  # plane 1's words only
    with pytest.raises(CorruptError, match="rans32"):
        p.decode_chunk(bytes(stream1), out, base)
    p.decode_chunk(good, out, base)
    assert out == raw


def batch_items(seed: int = 0) -> list[tuple[Pipeline, bytes, bytes | None]]:
    """A mixed run of chunks: every candidate pipeline of three dtypes, with and without a base,
    one of them empty."""
    items = []
    for k, dtype in enumerate((torch.float32, torch.bfloat16, torch.int32)):
        for j, p in enumerate(candidates(dtype)):
            n = 0 if (k, j) == (1, 0) else 3000 + 101 * j
            raw, base = pair(dtype, n, "weights" if j % 2 == 0 else "random", seed=seed + 7 * k + j)
            items.append((p, raw, base if p.residual is not None else None))
    return items


def test_encode_chunks_is_encode_chunk_run_after_run() -> None:
    """One call for a run of chunks: the streams of encode_chunk one after another, with their
    lengths and both checksums, whatever pipelines the run mixes."""
    items = batch_items()
    specs = [p.native_spec(b is not None) for p, _, b in items]
    assert all(spec is not None for spec in specs)
    stored, entries = N.encode_chunks([(raw, b, *spec) for (p, raw, b), spec in zip(items, specs)])
    refs = [p.encode_chunk(raw, b) for p, raw, b in items]
    assert stored == b"".join(refs)
    assert entries == [(len(ref), N.crc32c(ref), N.crc32c(raw)) for ref, (_, raw, _) in zip(refs, items)]
    assert N.encode_chunks([]) == (b"", [])


def test_decode_chunks_decodes_checks_and_names_the_first_failure() -> None:
    items = batch_items(seed=5)
    refs = [p.encode_chunk(raw, b) for p, raw, b in items]
    span = b"\xAA" * 3 + b"".join(refs)  # the streams need not start the span
    offsets = [3 + sum(len(r) for r in refs[:i]) for i in range(len(refs))]

    def batch(outs: list[bytearray], stored: bytes = span, crc_fix: int = -1) -> list[tuple]:
        return [(off, len(ref), N.crc32c(ref), out, b, *p.native_spec(b is not None),  # type: ignore[misc]
                 N.crc32c(raw) ^ (1 if i == crc_fix else 0))
                for i, ((p, raw, b), ref, off, out) in enumerate(zip(items, refs, offsets, outs))]

    outs = [bytearray(len(raw)) for _, raw, _ in items]
    assert N.decode_chunks(span, batch(outs)) is None
    assert [bytes(o) for o in outs] == [raw for _, raw, _ in items]
    # a flipped stored byte in the third chunk: its stored checksum fails first
    damaged = bytearray(span)
    damaged[offsets[2] + len(refs[2]) // 2] ^= 0x10
    outs = [bytearray(len(raw)) for _, raw, _ in items]
    assert N.decode_chunks(bytes(damaged), batch(outs)) == (2, 0, "")
    assert bytes(outs[1]) == items[1][1]  # the chunks before it were decoded
    # a wrong raw checksum: the decoded bytes fail theirs
    assert N.decode_chunks(span, batch([bytearray(len(r)) for _, r, _ in items], crc_fix=4)) == (4, 2, "")
    # a malformed stream whose stored checksum matches: decoded, refused, with the reason
    cut = refs[1][: len(refs[1]) // 2]
    bad = [(0, len(cut), N.crc32c(cut), bytearray(len(items[1][1])), items[1][2],
            *items[1][0].native_spec(items[1][2] is not None), 0)]  # type: ignore[misc]
    position, what, message = N.decode_chunks(cut, bad)  # type: ignore[misc]
    assert (position, what) == (0, 1) and message


def test_decode_chunks_trusts_no_offset_or_length() -> None:
    p, raw, b = batch_items()[0]
    ref = p.encode_chunk(raw, b)
    spec = p.native_spec(b is not None)
    assert spec is not None
    out = bytearray(len(raw))
    for offset, length in ((-1, len(ref)), (0, len(ref) + 1), (len(ref) + 1, 0), (1, -1),
                           (1 << 62, 1 << 62)):
        with pytest.raises(ValueError, match="outside the span"):
            N.decode_chunks(ref, [(offset, length, 0, out, b, *spec, 0)])
    with pytest.raises(ValueError, match="32 bits"):
        N.decode_chunks(ref, [(0, len(ref), 1 << 32, out, b, *spec, 0)])
    with pytest.raises(ValueError, match="overlaps"):
        span = bytearray(ref + bytes(len(raw)))
        N.decode_chunks(span, [(0, len(ref), N.crc32c(ref), memoryview(span)[len(ref):], b, *spec, 0)])
    with pytest.raises(TypeError):
        N.decode_chunks(ref, [(0, len(ref), 0, bytes(len(raw)), b, *spec, 0)])  # dst read-only
    with pytest.raises(ValueError):
        N.decode_chunks(ref, [(0, len(ref), 0, out, b, 3, 0, -1, -1, 0)])  # spec
    with pytest.raises(TypeError):
        N.encode_chunks([(raw,)])
    with pytest.raises(ValueError):
        N.encode_chunks([(raw[:-1], None, 4, 0, -1, -1)])  # ragged


def _moment_like_chunks(count: int, seed: int) -> list[bytes]:
    """fp32 chunks whose exponent plane is coded RANS32: nine in ten values share one exponent
    (under a bit per symbol, where Huffman spends one), for the paired decode of two chunks'
    rANS planes."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        scale = np.where(rng.random(20_000) < 0.9, 1.0, 2.0 ** rng.integers(-4, 4, 20_000))
        out.append((rng.uniform(1, 2, 20_000) * scale).astype(np.float32).tobytes())
    return out


def _batch_of(chunks: list[bytes], streams: list[bytes]) -> tuple[bytes, list[tuple]]:
    span = b"".join(streams)
    offsets = np.cumsum([0] + [len(s) for s in streams])
    items = [(int(offsets[i]), len(s), N.crc32c(s), bytearray(len(c)), None, 4, 1, -1, -1,
              N.crc32c(c)) for i, (c, s) in enumerate(zip(chunks, streams))]
    return span, items


def test_decode_chunks_pairs_decode_as_one_by_one() -> None:
    """Consecutive dense chunks decode two at a time (their rANS planes in one loop): the bytes
    and, on damage, the first failure (chunk, kind, message) are those of one chunk at a time."""
    chunks = [*_moment_like_chunks(5, seed=1), pair(torch.float32, 20_000, "random", 2)[0]]
    streams = [N.encode_planes(c, 4, 1) for c in chunks]
    assert all(segment_modes(s)[3] == 4 for s in streams[:5])  # the exponent plane: RANS32
    span, items = _batch_of(chunks, streams)
    assert N.decode_chunks(span, items) is None
    assert [bytes(it[3]) for it in items] == chunks
    rng = np.random.default_rng(7)
    outcomes = set()
    for trial in range(60):
        damaged = [bytearray(s) for s in streams]
        for _ in range(int(rng.integers(1, 3))):
            j = int(rng.integers(0, len(damaged)))
            # the exponent plane's rANS body comes last: half the flips land in the last 20%
            low = 0 if rng.random() < 0.5 else len(damaged[j]) * 4 // 5
            damaged[j][int(rng.integers(low, len(damaged[j])))] ^= 1 << int(rng.integers(0, 8))
        span, items = _batch_of(chunks, [bytes(d) for d in damaged])  # stored CRCs made to match
        if trial % 3 == 0:  # and a stale raw checksum now and then
            k = int(rng.integers(0, len(items)))
            items[k] = (*items[k][:9], items[k][9] ^ 1)
        expected = None
        for j, item in enumerate(items):
            alone = N.decode_chunks(span, [(*item[:3], bytearray(len(item[3])), *item[4:])])
            if alone is not None:
                expected = (j, *alone[1:])
                break
        assert N.decode_chunks(span, items) == expected, trial
        outcomes.add(None if expected is None else expected[1])
    assert {1, 2} <= outcomes  # malformed streams and wrong bytes both came up
