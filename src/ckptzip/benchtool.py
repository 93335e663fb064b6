"""The measuring engine of ``ckptzip bench`` and ``benchmarks/``: ckptzip against its peers.

ckptzip is measured through its public API on the whole state (``dumps``/``loads``). Each peer
(:mod:`ckptzip.peers`) is measured on the same bytes: every array ckptzip stores (tensors that
share storage count once, as :func:`ckptzip.tree.flatten` sees them), one at a time, sizes and
times summed over the state. Every round trip is verified bit for bit before a row is reported.

Speeds are MB (10^6 bytes) of *raw* data per second, best of ``repeat`` timed passes over the
whole state after one warm-up pass; the tools take turns pass after pass, so that a slow spell of a
shared machine falls on all of them alike.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import ckptzip

from . import peers as peer_registry
from .errors import CorruptError, DependencyError
from .tree import Leaf, flatten

#: The tool name under which ckptzip itself is measured.
CKPTZIP = "ckptzip"
#: Elements per histogram for :func:`entropy_bound` (as in FIELD.md).
BOUND_CHUNK = 1 << 16


@dataclass(frozen=True)
class BenchRow:
    """One tool's result on one state."""

    tool: str
    threads: int
    raw_bytes: int
    stored_bytes: int
    ratio: float
    compress_mbps: float
    decompress_mbps: float


@dataclass
class _Prepared:
    """A tool ready to be timed: its round trip verified once (the warm-up pass); each call
    returns the seconds its clock measured."""

    tool: str
    raw_bytes: int
    stored_bytes: int
    compress: Callable[[], float]
    decompress: Callable[[], float]


def _interleaved_best(runs: list[Callable[[], float]], repeat: int) -> list[float]:
    """Best seconds of each run over ``repeat`` rounds in which every run takes one turn, so that
    a slow spell of a shared machine falls on all the tools alike."""
    best = [math.inf] * len(runs)
    for _ in range(max(1, repeat)):
        for i, run in enumerate(runs):
            best[i] = min(best[i], run())
    return best


def _mbps(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / seconds if seconds > 0 else math.inf


def _row(tool: str, threads: int, raw: int, stored: int, c_s: float, d_s: float) -> BenchRow:
    ratio = raw / stored if stored else math.inf
    return BenchRow(tool, threads, raw, stored, ratio, _mbps(raw, c_s), _mbps(raw, d_s))


def _check_equal(name: str, tool: str, expected: np.ndarray, actual: np.ndarray) -> None:
    if expected.tobytes() != actual.tobytes():
        raise CorruptError(f"{tool} did not round-trip {name} bit for bit")


def _leaf_array(leaf: Leaf) -> np.ndarray:
    """A leaf's raw bytes viewed with its numpy dtype, or an unsigned view of its width
    (bf16 as uint16) when numpy has no such type."""
    dtype = leaf.dtype.numpy_dtype or np.dtype(f"u{leaf.dtype.itemsize}")
    return leaf.host_bytes().view(dtype).reshape(leaf.shape)


def _prepare_ckptzip(state: Any, leaves: list[Leaf], threads: int) -> _Prepared:
    raw = sum(leaf.nbytes for leaf in leaves)
    blob = ckptzip.dumps(state, threads=threads)
    restored = flatten(ckptzip.loads(blob, threads=threads))[1]
    if [leaf.name for leaf in restored] != [leaf.name for leaf in leaves]:
        raise CorruptError(f"{CKPTZIP}: loads() returned a state with other tensors than dumps()")
    for before, after in zip(leaves, restored, strict=True):
        if (before.dtype, before.shape) != (after.dtype, after.shape):
            raise CorruptError(f"{CKPTZIP}: {before.name} came back with another dtype or shape")
        _check_equal(before.name, CKPTZIP, before.host_bytes(), after.host_bytes())

    def compress() -> float:
        start = time.perf_counter()
        ckptzip.dumps(state, threads=threads)
        return time.perf_counter() - start

    def decompress() -> float:
        start = time.perf_counter()
        ckptzip.loads(blob, threads=threads)
        return time.perf_counter() - start

    return _Prepared(CKPTZIP, raw, len(blob), compress, decompress)


def _prepare_peer(peer: peer_registry.Peer, leaves: list[Leaf], threads: int) -> _Prepared:
    arrays = [(leaf.name, leaf.dtype.name, _leaf_array(leaf)) for leaf in leaves]
    blobs = []
    for name, dtype, array in arrays:  # the warm-up pass, verified
        blob = peer.compress(array.copy(), threads=threads, dtype=dtype, scratch=True)
        _check_equal(
            name, peer.name, array, peer.decompress(blob, array, threads=threads, dtype=dtype)
        )
        blobs.append(blob)

    def compress() -> float:
        total = 0.0
        for _, dtype, array in arrays:
            work = array.copy()  # made before the clock starts, so zipnn may overwrite it
            start = time.perf_counter()
            peer.compress(work, threads=threads, dtype=dtype, scratch=True)
            total += time.perf_counter() - start
        return total

    def decompress() -> float:
        total = 0.0
        for (_, dtype, array), blob in zip(arrays, blobs, strict=True):
            start = time.perf_counter()
            peer.decompress(blob, array, threads=threads, dtype=dtype)
            total += time.perf_counter() - start
        return total

    return _Prepared(peer.name, sum(a.nbytes for _, _, a in arrays), sum(len(b) for b in blobs),
                     compress, decompress)


def default_tools() -> list[str]:
    """ckptzip and every peer that is installed."""
    return [CKPTZIP, *(name for name, peer in peer_registry.PEERS.items() if peer.available())]


def compare(
    state: Any,
    *,
    threads: int = 1,
    repeat: int = 3,
    peers: Sequence[str] | None = None,
    progress: bool = False,
) -> list[BenchRow]:
    """Measure ckptzip and its peers on ``state`` (a state dict or any nested training state).

    ``peers`` names the tools to run, ``"ckptzip"`` among them; None means
    :func:`default_tools`. A named peer that is not installed raises :class:`DependencyError`.
    """
    leaves = flatten(state)[1]
    prepared: list[_Prepared] = []
    for tool in default_tools() if peers is None else peers:
        start = time.perf_counter()
        if tool == CKPTZIP:
            prepared.append(_prepare_ckptzip(state, leaves, threads))
        else:
            peer = peer_registry.get(tool)
            reason = peer.unavailable_reason()
            if reason is not None:
                raise DependencyError(reason)
            prepared.append(_prepare_peer(peer, leaves, threads))
        if progress:
            ratio = prepared[-1].raw_bytes / max(prepared[-1].stored_bytes, 1)
            print(f"  {tool} ({threads} thread{'s' if threads > 1 else ''}): ratio {ratio:.3f}, "
                  f"verified in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    # the tools take turns, compressing round after round, then decompressing
    start = time.perf_counter()
    compress = _interleaved_best([p.compress for p in prepared], repeat)
    decompress = _interleaved_best([p.decompress for p in prepared], repeat)
    if progress:
        print(f"  timed {len(prepared)} tools in {time.perf_counter() - start:.1f} s",
              file=sys.stderr)
    return [_row(p.tool, threads, p.raw_bytes, p.stored_bytes, c, d)
            for p, c, d in zip(prepared, compress, decompress, strict=True)]


def _xlog2x(values: np.ndarray) -> float:
    """Sum of x * log2(x) over the non-zero ``values``."""
    x = values[values > 0].astype(np.float64)
    return float(np.sum(x * np.log2(x)))


def _plane_entropy_bits(planes: np.ndarray, chunk: int) -> float:
    """Order-0 entropy in bits of ``planes`` (elements x planes, uint8), with one byte histogram
    per plane per ``chunk`` consecutive elements: the sum of n log2 n - sum of c log2 c."""
    chunk_of = np.arange(planes.shape[0], dtype=np.int64) // chunk * 256
    total = 0.0
    for plane in planes.T:
        counts = np.bincount(chunk_of + plane, minlength=chunk_of[-1] + 256).reshape(-1, 256)
        total += _xlog2x(counts.sum(axis=1)) - _xlog2x(counts)
    return total


def entropy_bound(state: Any, *, chunk: int = BOUND_CHUNK) -> float:
    """The ratio an order-0 coder of byte planes could reach at best on ``state``.

    Floats are first rotated left by one bit (the sign to the low bit, so the whole exponent of
    bf16/fp32 is one byte), then split in byte planes; each plane of each run of ``chunk``
    elements gets its own histogram (runs restart at every tensor). The bound is raw bits / the
    sum of those entropies (tables are free, so no real coder of this kind reaches it).
    """
    raw_bits = 0
    entropy_bits = 0.0
    for leaf in flatten(state)[1]:
        width, rotate = leaf.dtype.plane_layout
        data = leaf.host_bytes()
        if rotate:
            words = data.view(f"<u{width}")
            shift = words.dtype.type
            data = ((words << shift(rotate)) | (words >> shift(8 * width - rotate))).view(np.uint8)
        step = width * chunk * 64  # 64 chunks at a time bounds the memory used
        for start in range(0, data.size, step):
            entropy_bits += _plane_entropy_bits(
                data[start : start + step].reshape(-1, width), chunk
            )
        raw_bits += 8 * data.size
    return raw_bits / entropy_bits if entropy_bits else math.inf


_COLUMNS = ("tool", "threads", "raw MB", "stored MB", "ratio", "compress MB/s", "decompress MB/s")


def format_table(rows: Sequence[BenchRow], title: str) -> str:
    """``rows`` as an aligned markdown table under ``title``."""
    cells = [
        (
            r.tool,
            str(r.threads),
            f"{r.raw_bytes / 1e6:.2f}",
            f"{r.stored_bytes / 1e6:.2f}",
            f"{r.ratio:.3f}",
            f"{r.compress_mbps:.0f}",
            f"{r.decompress_mbps:.0f}",
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [_COLUMNS, *cells]) for i in range(len(_COLUMNS))]

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if i else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = line([":" + "-" * (widths[0] - 1), *("-" * (w - 1) + ":" for w in widths[1:])])
    return "\n".join([title, "", line(_COLUMNS), rule, *(line(c) for c in cells)])
