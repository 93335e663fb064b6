"""The measuring engine of ``ckptzip bench`` and ``benchmarks/``: ckptzip against its peers.

ckptzip is measured through its public API on the whole state (``dumps``/``loads``). Each peer
(:mod:`ckptzip.peers`) is measured on the same bytes: every array ckptzip stores (tensors that
share storage count once, as :func:`ckptzip.tree.flatten` sees them), one at a time, sizes and
times summed over the state. Every round trip is verified bit for bit before a row is reported.

Speeds are MB (10^6 bytes) of *raw* data per second, best of ``repeat`` timed passes over the
whole state after one warm-up pass; the tools take turns pass after pass, so that a slow spell of a
shared machine falls on all of them alike. Fair timing:

- Input copies (zipnn overwrites its input) and bit-exact checks stay outside every clock.
- At N threads a peer runs the way its users would, whichever of the two is faster for it, per
  direction: its own N threads on one tensor after another (``own``), or a pool of N threads over
  the tensors, each call on one thread (``pool``). ckptzip is given the whole state and its
  ``threads``.
- Decompression is also timed in a fresh process (``fresh_repeat``): imports and reading the
  compressed bytes are outside the clock, the first decode is inside it, with its first touches
  of fresh memory; a warm repeated load reuses memory a previous load faulted in.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

import ckptzip

from . import peers as peer_registry
from .errors import CorruptError, DependencyError
from .tree import Leaf, flatten

#: The tool name under which ckptzip itself is measured.
CKPTZIP = "ckptzip"
#: Elements per histogram for :func:`entropy_bound` (as in FIELD.md).
BOUND_CHUNK = 1 << 16
#: How a peer uses N threads: its own threads, tensor after tensor; or a pool over the tensors.
OWN, POOL = "own", "pool"

T = TypeVar("T")


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
    #: One decode in a fresh process (best of ``fresh_repeat``); None when not measured.
    fresh_decompress_mbps: float | None = None
    #: How a peer used its threads to compress / decompress (``own`` or ``pool``); "" for ckptzip.
    how: str = ""


@dataclass
class _Prepared:
    """A tool ready to be timed: its round trip verified once (the warm-up pass); each call
    returns the seconds its clock measured. ``fresh`` writes what a fresh process needs to
    decode its output (:func:`fresh_decode_seconds`) under a directory and returns the spec."""

    tool: str
    how: str
    raw_bytes: int
    stored_bytes: int
    compress: Callable[[], float]
    decompress: Callable[[], float]
    fresh: Callable[[Path], dict[str, Any]]


def per_tensor(work: Callable[[int, int], T], count: int, threads: int, how: str,
               pool: ThreadPoolExecutor | None) -> list[T]:
    """``work(i, peer_threads)`` for every tensor ``i``: one after another with the peer's own
    ``threads`` (``OWN``), or on ``pool``'s threads, each call given one thread (``POOL``)."""
    if how == POOL:
        if pool is None:
            raise ValueError("a pool is needed to run tensors on a pool")
        return list(pool.map(lambda i: work(i, 1), range(count)))
    return [work(i, threads) for i in range(count)]


def ways(threads: int) -> tuple[str, ...]:
    """The ways a peer may use ``threads`` threads: a pool only pays with more than one."""
    return (OWN, POOL) if threads > 1 else (OWN,)


def digest(arrays: Sequence[np.ndarray]) -> str:
    """SHA-256 of the arrays' bytes in order: how a fresh process's output is checked."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def _interleaved_best(runs: Sequence[Callable[[], float]], repeat: int) -> list[float]:
    """Best seconds of each run over ``repeat`` rounds in which every run takes one turn, so that
    a slow spell of a shared machine falls on all the tools alike."""
    best = [math.inf] * len(runs)
    for _ in range(max(1, repeat)):
        for i, run in enumerate(runs):
            best[i] = min(best[i], run())
    return best


def _mbps(nbytes: int, seconds: float) -> float:
    return nbytes / 1e6 / seconds if seconds > 0 else math.inf


def _row(tool: str, threads: int, raw: int, stored: int, c_s: float, d_s: float,
         how: str = "") -> BenchRow:
    ratio = raw / stored if stored else math.inf
    return BenchRow(tool, threads, raw, stored, ratio, _mbps(raw, c_s), _mbps(raw, d_s), how=how)


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

    def fresh(directory: Path) -> dict[str, Any]:
        return fresh_spec(directory, CKPTZIP, threads, [blob])

    return _Prepared(CKPTZIP, "", raw, len(blob), compress, decompress, fresh)


def _prepare_peer(peer: peer_registry.Peer, leaves: list[Leaf], threads: int, how: str,
                  pool: ThreadPoolExecutor | None) -> _Prepared:
    arrays = [(leaf.name, leaf.dtype.name, _leaf_array(leaf)) for leaf in leaves]

    def coder(inputs: list[np.ndarray]) -> Callable[[int, int], bytes]:
        return lambda i, t: peer.compress(inputs[i], threads=t, dtype=arrays[i][1], scratch=True)

    # the warm-up pass, verified
    blobs = per_tensor(coder([a.copy() for _, _, a in arrays]), len(arrays), threads, how, pool)
    for (name, dtype, array), blob in zip(arrays, blobs, strict=True):
        _check_equal(name, peer.name, array, peer.decompress(blob, array, threads=threads, dtype=dtype))

    def compress() -> float:
        work = coder([a.copy() for _, _, a in arrays])  # copies made before the clock starts
        start = time.perf_counter()
        per_tensor(work, len(arrays), threads, how, pool)
        return time.perf_counter() - start

    def decode(i: int, t: int) -> np.ndarray:
        return peer.decompress(blobs[i], arrays[i][2], threads=t, dtype=arrays[i][1])

    def decompress() -> float:
        start = time.perf_counter()
        per_tensor(decode, len(arrays), threads, how, pool)
        return time.perf_counter() - start

    def fresh(directory: Path) -> dict[str, Any]:
        return fresh_spec(directory, peer.name, threads, blobs, how=how,
                          arrays=[(a, dtype) for _, dtype, a in arrays])

    return _Prepared(peer.name, how, sum(a.nbytes for _, _, a in arrays), sum(len(b) for b in blobs),
                     compress, decompress, fresh)


def fresh_spec(directory: Path, tool: str, threads: int, blobs: Sequence[bytes], *, how: str = OWN,
               arrays: Sequence[tuple[np.ndarray, str]] = (), base: bytes | None = None,
               ) -> dict[str, Any]:
    """Write what a fresh process needs to decode ``blobs`` under ``directory``; the spec for
    :func:`fresh_decode_seconds`. ckptzip: one blob, and as ``base`` the base state's blob (it
    is decoded before the clock starts). A peer: a blob per array of ``arrays`` (each given as an
    array of its numpy dtype and shape, and its dtype name), and as ``base`` the raw bytes its
    output is XORed with (an XOR delta; the XOR is inside the clock)."""
    (directory / "blob").write_bytes(b"".join(blobs))
    spec: dict[str, Any] = {"tool": tool, "threads": threads, "how": how,
                            "blob": str(directory / "blob"), "lengths": [len(b) for b in blobs],
                            "arrays": [[a.dtype.str, list(a.shape), dtype] for a, dtype in arrays]}
    if base is not None:
        (directory / "base").write_bytes(base)
        spec["base"] = str(directory / "base")
    return spec


def fresh_best(runs: Sequence[tuple[dict[str, Any], str]], repeat: int) -> list[float]:
    """Best seconds of one fresh-process decode for each (spec, expected digest), in turns."""
    return _interleaved_best([partial(fresh_decode_seconds, spec, expected) for spec, expected in runs],
                             repeat)


def fresh_decode_seconds(spec: dict[str, Any], expected: str) -> float:
    """Seconds of one decode in a fresh Python process (``python -m ckptzip.benchtool``), from
    the spec a :class:`_Prepared` wrote; the output's digest must be ``expected``."""
    out = subprocess.run([sys.executable, "-m", "ckptzip.benchtool", json.dumps(spec)],
                         capture_output=True, text=True, check=False)
    if out.returncode:
        raise CorruptError(f"{spec['tool']}: the fresh-process decode failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["digest"] != expected:
        raise CorruptError(f"{spec['tool']}: a fresh process did not decode the input bit for bit")
    return float(result["seconds"])


def _fresh_decode(spec: dict[str, Any]) -> dict[str, Any]:
    """The child's side of :func:`fresh_decode_seconds`: import the tool and read its input,
    then time one decode."""
    blob = Path(spec["blob"]).read_bytes()
    threads = int(spec["threads"])
    if spec["tool"] == CKPTZIP:
        base = ckptzip.loads(Path(spec["base"]).read_bytes()) if spec.get("base") else None
        start = time.perf_counter()
        state = ckptzip.loads(blob, threads=threads, base=base)
        seconds = time.perf_counter() - start
        outputs = [leaf.host_bytes() for leaf in flatten(state)[1]]
    else:
        peer = peer_registry.get(spec["tool"])
        if not peer.available():  # imports the peer's package, as ckptzip's is, off the clock
            raise DependencyError(peer.unavailable_reason() or spec["tool"])
        likes = [np.broadcast_to(np.zeros((), np.dtype(d)), shape) for d, shape, _ in spec["arrays"]]
        offsets = np.cumsum([0, *spec["lengths"]]).tolist()
        blobs = [blob[a:b] for a, b in pairwise(offsets)]
        bases = None
        if spec.get("base"):  # an XOR delta: the base's raw bytes, tensor after tensor
            raw = np.fromfile(spec["base"], np.uint8)
            ends = np.cumsum([0, *(like.nbytes for like in likes)]).tolist()
            bases = [raw[a:b] for a, b in pairwise(ends)]

        def decode(i: int, t: int) -> np.ndarray:
            out = peer.decompress(blobs[i], likes[i], threads=t, dtype=spec["arrays"][i][2])
            if bases is None:
                return out
            return np.bitwise_xor(np.ascontiguousarray(out).reshape(-1).view(np.uint8), bases[i])

        pool = ThreadPoolExecutor(threads) if spec.get("how") == POOL else None
        start = time.perf_counter()
        outputs = per_tensor(decode, len(likes), threads, spec.get("how", OWN), pool)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "digest": digest(outputs)}


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
    fresh_repeat: int = 0,
) -> list[BenchRow]:
    """Measure ckptzip and its peers on ``state`` (a state dict or any nested training state).

    ``peers`` names the tools to run, ``"ckptzip"`` among them; None means
    :func:`default_tools`. A named peer that is not installed raises :class:`DependencyError`.
    At more than one thread each peer is timed both ways (:data:`OWN`, :data:`POOL`) and its row
    keeps the faster per direction. ``fresh_repeat`` > 0 also times that many one-decode fresh
    processes per tool, in turns, and keeps the best.
    """
    leaves = flatten(state)[1]
    tools = default_tools() if peers is None else list(peers)
    prepared: list[_Prepared] = []
    with ThreadPoolExecutor(threads) as pool:
        for tool in tools:
            start = time.perf_counter()
            if tool == CKPTZIP:
                prepared.append(_prepare_ckptzip(state, leaves, threads))
            else:
                peer = peer_registry.get(tool)
                reason = peer.unavailable_reason()
                if reason is not None:
                    raise DependencyError(reason)
                prepared += [_prepare_peer(peer, leaves, threads, how, pool) for how in ways(threads)]
            if progress:
                ratio = prepared[-1].raw_bytes / max(prepared[-1].stored_bytes, 1)
                print(f"  {tool} ({threads} thread{'s' if threads > 1 else ''}): ratio {ratio:.3f}, "
                      f"verified in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        # the tools take turns, compressing round after round, then decompressing
        start = time.perf_counter()
        compress = _interleaved_best([p.compress for p in prepared], repeat)
        decompress = _interleaved_best([p.decompress for p in prepared], repeat)
    if progress:
        print(f"  timed {len(prepared)} runs in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    rows = []
    for tool in tools:
        mine = [i for i, p in enumerate(prepared) if p.tool == tool]
        c = min(mine, key=lambda i: compress[i])
        d = min(mine, key=lambda i: decompress[i])
        p = prepared[c]
        how = f"{p.how} / {prepared[d].how}" if p.how else ""
        rows.append(_row(tool, threads, p.raw_bytes, p.stored_bytes, compress[c], decompress[d], how))
    if fresh_repeat > 0:
        fresh = _fresh_best([prepared[min((i for i, p in enumerate(prepared) if p.tool == r.tool),
                                          key=lambda i: decompress[i])] for r in rows],
                            digest([leaf.host_bytes() for leaf in leaves]), fresh_repeat)
        rows = [replace(r, fresh_decompress_mbps=_mbps(r.raw_bytes, s)) for r, s in zip(rows, fresh)]
        if progress:
            print(f"  timed {len(rows)} tools' fresh-process decodes", file=sys.stderr)
    return rows


def _fresh_best(prepared: list[_Prepared], expected: str, repeat: int) -> list[float]:
    """Best seconds of one fresh-process decode per tool, the tools taking turns."""
    with tempfile.TemporaryDirectory(prefix="ckptzip-bench-") as tmp:
        specs = []
        for i, p in enumerate(prepared):
            directory = Path(tmp) / str(i)
            directory.mkdir()
            specs.append((p.fresh(directory), expected))
        return fresh_best(specs, repeat)


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
_FRESH = "decompress MB/s, fresh process"
_HOW = "threads used as (c / d)"


def format_table(rows: Sequence[BenchRow], title: str) -> str:
    """``rows`` as an aligned markdown table under ``title``; the fresh-process decode and the
    peers' use of threads get columns when any row has them."""
    fresh = any(r.fresh_decompress_mbps is not None for r in rows)
    how = any(r.how for r in rows)
    columns = (*_COLUMNS, *((_FRESH,) if fresh else ()), *((_HOW,) if how else ()))
    cells = [
        (
            r.tool,
            str(r.threads),
            f"{r.raw_bytes / 1e6:.2f}",
            f"{r.stored_bytes / 1e6:.2f}",
            f"{r.ratio:.3f}",
            f"{r.compress_mbps:.0f}",
            f"{r.decompress_mbps:.0f}",
            *((f"{r.fresh_decompress_mbps or 0:.0f}",) if fresh else ()),
            *((r.how or "-",) if how else ()),
        )
        for r in rows
    ]
    widths = [max(len(c[i]) for c in [columns, *cells]) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(w) if i else v.ljust(w)
            for i, (v, w) in enumerate(zip(values, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = line([":" + "-" * (widths[0] - 1), *("-" * (w - 1) + ":" for w in widths[1:])])
    return "\n".join([title, "", line(columns), rule, *(line(c) for c in cells)])


if __name__ == "__main__":  # a fresh process of fresh_decode_seconds
    print(json.dumps(_fresh_decode(json.loads(sys.argv[1]))))
