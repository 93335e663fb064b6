"""Encoding a state into a ``.ckz`` container: flatten, pick pipelines, compress chunks in
parallel, and write them in order behind a header."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import time
import zlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import IO, Any

import numpy as np
import torch

from . import _native, dtypes
from ._version import __version__
from .chain import Base
from .container import FORMAT_MAJOR, FORMAT_MINOR, PRELUDE_SIZE, pack_prelude, store_header
from .errors import ConfigError
from .modes import policy_for
from .objstore import MAX_PARTS, PART_BYTES, MultipartUpload, StorageOptions, parts_in_flight
from .parallel import executor, gc_paused, ordered_map, resolve_threads, task_bytes
from .pipeline import Pipeline
from .policy import DEFAULT_CHUNK_BYTES, Encoded, Exact, Policy
from .progress import Progress
from .storage import atomic_write, remote_upload
from .tree import Leaf, flatten, host_copies, tensor_bytes

#: Raw bytes handed to one worker task (several chunks, possibly of several small tensors), so
#: that task overhead stays small next to the work.


@dataclass
class SaveReport:
    """What a save did: sizes in bytes and wall seconds."""

    path: str | None
    raw_bytes: int
    stored_bytes: int
    seconds: float
    tensors: int
    mode: str

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else float("inf")

    def __str__(self) -> str:
        return (
            f"{self.path or '<memory>'}: {self.raw_bytes:,} -> {self.stored_bytes:,} bytes "
            f"({self.ratio:.3f}x) in {self.seconds:.2f}s"
        )


@dataclass
class _LeafPlan:
    leaf: Leaf
    pipeline: Pipeline
    chunk_bytes: int
    table: list[list[int]]
    offset: int = -1
    #: Raw bytes of the base tensor, for a pipeline with a residual stage.
    base_raw: np.ndarray | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The stored bytes of the leaf's single chunk, when choosing the pipeline already coded it.
    precoded: bytes | None = None
    #: The array a whole-tensor transform made of the leaf (lossy modes); None: the leaf itself.
    array: torch.Tensor | None = None

    @property
    def n_chunks(self) -> int:
        size = self.leaf.nbytes if self.array is None else self.array.numel() * self.array.element_size()
        return -(-size // self.chunk_bytes)


_Task = list[tuple[int, np.ndarray, np.ndarray | None]]  # (leaf index, raw chunk, base chunk)


def _tasks(
    leaves: list[Leaf], policy: Policy, base: Base | None, encoded: dict[int, _LeafPlan],
    plans: list[_LeafPlan], size_limit: int, exact: dict[int, Exact] | None = None,
) -> Iterator[_Task]:
    """Chunks in file order, grouped into tasks of about ``size_limit`` raw bytes (the last chunk
    crosses it). Each leaf is planned (and its bytes materialized on the host) only when its turn
    comes; its base's bytes are decoded at most PREFETCH_BYTES ahead and released once its chunks
    are scheduled, so a save never holds a second full copy of the state or of the base.
    ``exact``: leaves the policy left bit-exact, by index."""
    task: _Task = []
    size = 0
    ahead = 0  # leaves before this one have had their base tensors fetched
    for index, leaf in enumerate(leaves):
        if base is not None and index >= ahead:
            ahead = _prefetch_base(leaves, index, base, encoded)
        if index in encoded:
            plan = encoded.pop(index)
            assert plan.array is not None  # every encoded plan carries its array
            raw = tensor_bytes(plan.array)
        else:
            raw = leaf.host_bytes()
            plan = _plan_leaf(leaf, raw, policy, base, (exact or {}).get(index))
        plans.append(plan)
        if base is not None:
            base.release(leaf.name)
        for start in range(0, len(raw), plan.chunk_bytes):
            piece = raw[start : start + plan.chunk_bytes]
            end = start + plan.chunk_bytes
            base_chunk = None if plan.base_raw is None else plan.base_raw[start:end]
            task.append((index, piece, base_chunk))
            size += len(piece)
            if size >= size_limit:
                yield task
                task, size = [], 0
    if task:
        yield task


#: A run of stored chunks, one after another, and per chunk (leaf index, stored length, CRC of
#: the stored bytes, CRC of the raw bytes, raw length).
_Segment = tuple[bytes, list[tuple[int, int, int, int, int]]]


def _encode_task(plans: list[_LeafPlan], task: _Task) -> list[_Segment]:
    """Code a task's chunks (on a pool thread): runs of chunks the native core codes whole go
    to it in one call each (``_native.encode_chunks``, the GIL released once), the others
    (precoded, or pipelines with Python stages) one by one."""
    segments: list[_Segment] = []
    batch: list[tuple[np.ndarray, np.ndarray | None, int, int, int, int]] = []
    batch_leaves: list[int] = []

    def flush() -> None:
        if batch:
            stored, results = _native.encode_chunks(batch)
            segments.append((stored, [(index, length, crc, raw_crc, len(item[0]))
                                      for index, item, (length, crc, raw_crc)
                                      in zip(batch_leaves, batch, results)]))
            batch.clear()
            batch_leaves.clear()

    for index, raw, base_chunk in task:
        plan = plans[index]
        pipeline = plan.pipeline
        spec = None if plan.precoded else pipeline.native_spec(base_chunk is not None)
        if spec is not None:
            batch.append((raw, None if pipeline.residual is None else base_chunk, *spec))
            batch_leaves.append(index)
            continue
        flush()
        stored = plan.precoded or pipeline.encode_chunk(raw, base_chunk)
        segments.append((stored, [(index, len(stored), _native.crc32c(stored),
                                   _native.crc32c(raw), len(raw))]))
    flush()
    return segments


def _has_base_tensor(leaf: Leaf, base: Base) -> bool:
    """Whether ``base`` holds a tensor of the leaf's name, dtype and shape to code it against."""
    match = base.tensor(leaf.name)
    return match is not None and (match.dtype, match.shape) == (leaf.dtype, leaf.shape)


#: Raw bytes of base tensors a delta save decodes in one pass, at most (beyond one tensor): a
#: file base decodes them with all threads at once, and holds only this much ahead.
PREFETCH_BYTES = 64 << 20


def _prefetch_base(leaves: list[Leaf], start: int, base: Base, encoded: dict[int, _LeafPlan]) -> int:
    """Have the base tensors of the leaves from ``start`` on at hand, up to PREFETCH_BYTES of
    them (a file base decodes them in one pass); returns the first leaf not covered."""
    names: list[str] = []
    size, end = 0, start
    while end < len(leaves) and (not names or size + leaves[end].nbytes <= PREFETCH_BYTES):
        leaf = leaves[end]
        if end not in encoded and _has_base_tensor(leaf, base):
            names.append(leaf.name)
            size += leaf.nbytes
        end += 1
    base.prefetch(names)
    return end


def _encoded_plan(leaf: Leaf, encoding: Encoded, policy: Policy, base: Base | None) -> _LeafPlan:
    array = encoding.array
    width = encoding.pipeline.serializer.segments() if encoding.pipeline.serializer else 1
    chunk_bytes = max(width, policy.chunk_bytes(leaf) // width * width)
    extra = dict(encoding.extra)
    if encoding.pipeline.transforms:  # else the stored array is the leaf itself (a change mask)
        extra["encoded"] = {"dtype": dtypes.from_torch(array.dtype, leaf.name).name,
                            "shape": list(array.shape)}
    if encoding.uses_base:
        if base is None:
            raise ConfigError(f"{leaf.name}: the {policy.mode} policy coded it against a missing base")
        extra["base"] = {"name": leaf.name, "crc": _native.crc32c(base.raw(leaf.name))}
    return _LeafPlan(leaf, encoding.pipeline, chunk_bytes, [], extra=extra, array=array)


#: How much smaller a representation that codes twice as slowly must be to be chosen (2%).
SPEED_WEIGHT = 0.02
#: Bytes of a tensor on which the candidate representations against a base are tried: first a
#: quick sample, and a full one only when the quick one's best two scores lie within
#: TRIAL_MARGIN of each other. Sizing the candidates took 15% of a delta save of the full
#: training state at 64 KiB; 16 KiB alone lost 0.05-0.08% of its ratio (exp_avg_sq tensors near
#: the line, and fewer buckets in a small sample), the two steps none (docs/BENCHMARKS.md).
QUICK_TRIAL_BYTES = 16 << 10
TRIAL_BYTES = 64 << 10
TRIAL_MARGIN = 0.05


def _plan_leaf(leaf: Leaf, raw: np.ndarray, policy: Policy, base: Base | None,
               exact: Exact | None = None) -> _LeafPlan:
    """Pick the leaf's pipeline. Against a base, size a sample from the middle of the tensor with
    each candidate representation (dense included) and keep the smallest. The trials only size
    the streams (:meth:`Pipeline.encoded_size`, exact); when the sample is the whole tensor, the
    winner's stream is coded once and kept as the tensor's only chunk. A tensor the policy found
    unchanged (``exact``) is coded against the base with its first delta pipeline, untried (a
    difference of zeros, a few bytes a chunk), and its header entry says so."""
    chunk_bytes = policy.chunk_bytes(leaf)
    dense = policy.pipeline_for(leaf)
    if base is None or leaf.nbytes == 0 or not _has_base_tensor(leaf, base):
        return _LeafPlan(leaf, dense, chunk_bytes, [])
    base_raw = base.raw(leaf.name)
    deltas = policy.delta_candidates(leaf)
    if exact is not None and exact.unchanged and deltas:
        extra = {"base": {"name": leaf.name, "crc": _native.crc32c(base_raw)}, "unchanged": True}
        return _LeafPlan(leaf, deltas[0], chunk_bytes, [], base_raw=base_raw, extra=extra)
    candidates = [dense, *deltas]
    width = leaf.dtype.plane_layout[0]
    for trial_bytes in (QUICK_TRIAL_BYTES, TRIAL_BYTES):
        size = min(len(raw), max(width, trial_bytes // width * width))
        start = (len(raw) - size) // 2 // width * width
        sample, base_sample = raw[start : start + size], base_raw[start : start + size]
        scores = sorted(
            (pipeline.encoded_size(sample, None if pipeline is dense else base_sample)
             * (1 + SPEED_WEIGHT * (pipeline.relative_cost - 1)), i)
            for i, pipeline in enumerate(candidates)
        )
        decided = len(scores) == 1 or scores[1][0] > scores[0][0] * (1 + TRIAL_MARGIN)
        if decided or size == len(raw):
            break
    best = candidates[scores[0][1]]
    whole = size == len(raw) <= chunk_bytes
    if best is dense:
        precoded = dense.encode_chunk(sample) if whole else None
        return _LeafPlan(leaf, dense, chunk_bytes, [], precoded=precoded)
    precoded = best.encode_chunk(sample, base_sample) if whole else None
    extra = {"base": {"name": leaf.name, "crc": _native.crc32c(base_raw)}}
    return _LeafPlan(leaf, best, chunk_bytes, [], base_raw=base_raw, extra=extra, precoded=precoded)


def chain_base(base: Base | None, keyframe_every: int | None) -> Base | None:
    """The base a new checkpoint is coded against: none when the chain would reach
    ``keyframe_every`` checkpoints (this one becomes a standalone keyframe)."""
    if keyframe_every is not None and (type(keyframe_every) is not int or keyframe_every < 1):
        raise ConfigError(f"keyframe_every must be a positive int or None, not {keyframe_every!r}")
    if base is not None and keyframe_every is not None and base.depth + 1 >= keyframe_every:
        return None
    return base


@dataclass
class Prepared:
    """A state flattened and planned ahead of writing.

    :class:`ckptzip.CheckpointManager` prepares a lossy checkpoint of tensors on an accelerator
    where they are (the transforms are torch ops), copies only the transformed arrays (codes) and
    the untransformed leaves to the host with :meth:`to_host`, and writes that in the background.
    """

    tree: Any
    leaves: list[Leaf]
    mode: str
    #: The base the plan was made against (None: a keyframe); closed by whoever writes it.
    base: Base | None
    #: Plans of the leaves the mode transformed, by leaf index (their arrays, not their leaves'
    #: tensors, are what gets stored).
    encoded: dict[int, _LeafPlan]
    #: The mode's policy, which also picks the pipelines of the leaves it did not transform.
    policy: Policy
    #: Leaves the mode added after the state's own (low-rank factors): stored, but not part of
    #: the state, so not counted in its raw size.
    added: int = 0
    #: Leaves the mode left bit-exact (coded losslessly), by index.
    exact: dict[int, Exact] = field(default_factory=dict)

    def to_host(self) -> Prepared:
        """A copy whose arrays all live in fresh host memory (see :func:`host_copies`), so the
        caller may change its tensors as soon as this returns. A transformed leaf's own tensor
        is not copied: its plan's array is."""
        arrays = []
        for index, leaf in enumerate(self.leaves):
            plan = self.encoded.get(index)
            if plan is None:
                arrays.append(leaf.tensor)
            else:
                assert plan.array is not None  # every encoded plan carries its array
                arrays.append(plan.array)
        # the writer reads only a transformed leaf's name, dtype and shape: its tensor field
        # holds the stored array, so no reference to the caller's tensor outlives this call
        leaves = [replace(leaf, tensor=copy) for leaf, copy in zip(self.leaves, host_copies(arrays))]
        encoded = {index: replace(plan, leaf=leaves[index], array=leaves[index].tensor, table=[])
                   for index, plan in self.encoded.items()}
        return replace(self, leaves=leaves, encoded=encoded)


def prepare(
    state: Any,
    *,
    mode: str = "lossless",
    base: Base | None = None,
    keyframe_every: int | None = None,
    mode_options: dict[str, Any] | None = None,
    progress: bool = False,
    resumed: bool = False,
    threads: int | None = None,
) -> Prepared:
    """Flatten ``state`` and run the mode's whole-state transforms (lossy modes, against
    ``base``) where the tensors are, on ``threads`` threads (None: every core). Each
    transformed leaf's base reference is checksummed now, so the base's bytes need not stay
    cached until the write. ``progress``: a bar on a terminal while the transforms run
    (minutes for a large state on a CPU). ``resumed``: the training that made ``state`` went
    on from ``base`` as decoded (see :func:`ckptzip.save`)."""
    policy = policy_for(mode, **(mode_options or {}))
    base = chain_base(base, keyframe_every)
    tree, leaves = flatten(state)
    encoded = {}
    n_state = len(leaves)
    bar = Progress(1, f"{mode} transforms", enabled=progress)

    def planned(size: int, total: int) -> None:
        bar.total = max(total, 1)
        bar.update(size)

    plans = policy.plan_state(leaves, base, planned, resumed=resumed,
                              threads=resolve_threads(threads))
    bar.close()
    exact = {index: plan for index, plan in plans.items() if isinstance(plan, Exact)}
    for index, encoding in sorted(plans.items(), key=lambda p: p[0]):
        if isinstance(encoding, Exact):
            continue
        if index >= n_state:  # a leaf the mode adds, which the tree does not reference
            if index != len(leaves) or encoding.added is None:
                raise ConfigError(f"the {mode} policy planned leaf {index} of {len(leaves)} "
                                  f"without adding it")
            leaves.append(encoding.added)
        encoded[index] = _encoded_plan(leaves[index], encoding, policy, base)
        if base is not None:
            base.release(leaves[index].name)
    return Prepared(tree, leaves, mode, base, encoded, policy, len(leaves) - n_state, exact)


def _header_json(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _check_metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise ConfigError("metadata must be a dict with str keys")
    try:
        _header_json(metadata)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"metadata must be JSON-serializable (finite numbers): {exc}") from None
    return metadata


class Sink(ABC):
    """Receives the stored chunks in order, then the header."""

    def __init__(self) -> None:
        self.position = 0  # bytes of data section written so far
        self.reserved = 0  # bytes set aside for the header

    def reserve(self, header_size: Callable[[], int], data_size: int = 0, threads: int = 1) -> None:
        """Hints: ``header_size()`` estimates the stored header's length (a pass over the plans,
        so a sink calls it only if it places the data before the header is done), the data
        will be about ``data_size`` bytes at most, and ``threads`` threads code it."""

    @abstractmethod
    def write(self, data: bytes) -> None: ...

    @abstractmethod
    def finish(self, header: bytes) -> None:
        """Store the header's JSON in front of the data; afterwards ``reserved`` is the size of
        the header as stored."""


class MemorySink(Sink):
    """Builds the container as one bytes object (``_native.Assembler``: huge pages advised).

    Up to ``JOIN_BYTES`` of chunks are kept and copied behind the header at the end into an
    allocation of the exact size, which the allocator serves from its heap, warm when the
    previous result was freed. Beyond that, results are fresh mappings whatever the size asked,
    and keeping the chunks made the allocator map fresh memory for them too on every save (on a
    VM a fresh page's fault costs as long as coding it: 17,500 faults per dumps() of a 43 MB fp32
    state dict): then each chunk is copied into the result as it arrives, behind room for the
    header as estimated, and freed at once. The stored header is padded to that room, as a file
    writer pads it (a few KB on a result of over 16 MiB), and the data moves, in place, only when
    the header outgrows it: moving the 106 MB of a training state took 10 ms of a 200 ms dumps(),
    all of it on one thread.

    With several coding threads, the copies into the result are theirs too: the calling thread
    only sets each chunk's place aside (in order) and hands the copies, in batches, to the pool
    that codes. Copying a 106 MB result into fresh pages took 20-39 ms on the calling thread, a
    serial share that capped how far a save scales over cores.
    """

    #: Chunks kept for a final join, at most (measured: a bf16 GPT's 14 MB joined faults in
    #: nothing, while keeping 16-32 MB of a 36 MB result cost 5,000-8,600 faults per dumps).
    JOIN_BYTES = 16 << 20
    #: Bytes of chunks handed to the pool in one copy job (a job per chunk costs more to submit
    #: than some of its copies take).
    COPY_BATCH_BYTES = 2 << 20

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[bytes] = []
        self.assembler: _native.Assembler | None = None
        self.data_size = 0
        self.header_size: Callable[[], int] = lambda: 0
        self.header_room = 0
        self.threads = 1
        self.batch: list[tuple[int, bytes]] = []
        self.batch_bytes = 0
        self.copies: list[Future[None]] = []
        self.result = b""

    def reserve(self, header_size: Callable[[], int], data_size: int = 0, threads: int = 1) -> None:
        self.header_size = header_size  # called only if the result outgrows JOIN_BYTES
        self.data_size = data_size
        self.threads = threads

    def write(self, data: bytes) -> None:
        if self.assembler is None and self.position + len(data) > self.JOIN_BYTES:
            # large: assemble in place from now on (the coding threads run meanwhile)
            self.header_room = self.header_size()
            self.assembler = _native.Assembler(PRELUDE_SIZE + self.header_room,
                                               max(self.data_size, self.JOIN_BYTES))
            parts, self.parts = self.parts, []
            for part in parts:
                self._add(self.assembler, part)
        if self.assembler is not None:
            self._add(self.assembler, data)
        else:
            self.parts.append(data)
        self.position += len(data)

    def _add(self, assembler: _native.Assembler, data: bytes) -> None:
        if self.threads > 1:
            self._place(assembler, data)
        else:
            assembler.append(data)

    def _place(self, assembler: _native.Assembler, data: bytes) -> None:
        """Set data's place aside now, in order, and have the pool copy it there."""
        if assembler.room < len(data):
            self._wait()  # growing moves the buffer: no copy may be running into it
        self.batch.append((assembler.claim(len(data)), data))
        self.batch_bytes += len(data)
        if self.batch_bytes >= self.COPY_BATCH_BYTES:
            self._submit()

    def _submit(self) -> None:
        if self.batch and self.assembler is not None:
            self.copies.append(executor(self.threads).submit(_copy_batch, self.assembler,
                                                             self.batch))
        self.batch, self.batch_bytes = [], 0

    def _wait(self) -> None:
        self._submit()
        copies, self.copies = self.copies, []
        for copy in copies:
            copy.result()

    def finish(self, header: bytes) -> None:
        self._wait()
        stored, flags = store_header(header)
        if self.assembler is not None and len(stored) < self.header_room:
            stored += b" " * (self.header_room - len(stored))  # the data stays where it is
        self.reserved = len(stored)
        head = pack_prelude(stored, flags) + stored
        assembler = self.assembler or _native.Assembler(len(head), self.position)
        for part in self.parts:
            assembler.append(part)
        self.parts = []
        self.result = assembler.finish(head)
        self.assembler = None


def _copy_batch(assembler: _native.Assembler, batch: list[tuple[int, bytes]]) -> None:
    for offset, data in batch:
        assembler.write_at(offset, data)


class FileSink(Sink):
    """Streams chunks into a seekable file behind a space reserved for the header.

    The reservation is the writer's estimate of the stored header with a margin, so the header is
    usually padded with spaces (a few KB). If the header outgrows it (rare), or if a small file
    would carry padding (moving its data is cheap), the data section is moved once to fit the
    header exactly.
    """

    #: Files whose data section is at most this large drop their padding: moving them is cheap.
    TRIM_DATA_BYTES = 64 << 20
    #: Padding below this is left in place.
    TRIM_MIN_PADDING = 256

    def __init__(self, handle: IO[bytes]) -> None:
        super().__init__()
        self.handle = handle

    def reserve(self, header_size: Callable[[], int], data_size: int = 0, threads: int = 1) -> None:
        self.reserved = header_size()
        self.handle.seek(PRELUDE_SIZE + self.reserved)

    def write(self, data: bytes) -> None:
        self.handle.write(data)
        self.position += len(data)

    def finish(self, header: bytes) -> None:
        stored, flags = store_header(header)
        padding = self.reserved - len(stored)
        trim = padding >= self.TRIM_MIN_PADDING and self.position <= self.TRIM_DATA_BYTES
        if padding < 0 or trim:
            self._move_data(len(stored))
        stored += b" " * (self.reserved - len(stored))
        self.handle.seek(0)
        self.handle.write(pack_prelude(stored, flags))
        self.handle.write(stored)
        self.handle.truncate(PRELUDE_SIZE + self.reserved + self.position)
        self.handle.seek(0, 2)

    def _move_data(self, header_size: int) -> None:
        """Shift the data section so that it starts right after a header of ``header_size``."""
        shift = header_size - self.reserved
        start = PRELUDE_SIZE + self.reserved
        block = 8 << 20
        # copy away from the direction of the shift, so no byte is overwritten before it moves
        offsets = list(range(start, start + self.position, block))
        for offset in reversed(offsets) if shift > 0 else offsets:
            size = min(block, start + self.position - offset)
            self.handle.seek(offset)
            data = self.handle.read(size)
            self.handle.seek(offset + shift)
            self.handle.write(data)
        self.reserved = header_size


class StreamSink(Sink):
    """Streams the container to an object store as it is coded, as a multipart upload.

    The data section goes up in parts as they fill, a few in flight (the upload blocks beyond
    that); its first part stays here until the header is known, and goes up last as part 1,
    behind the prelude and the header. So the header takes its exact size (nothing reserved,
    nothing moved), memory holds a few parts whatever the checkpoint's size, and the object
    appears, whole, only when the upload completes.
    """

    def __init__(self, upload: MultipartUpload) -> None:
        super().__init__()
        self.upload = upload
        self.part_bytes = PART_BYTES
        self.first = bytearray()
        self.buffer = bytearray()
        self.number = 2

    def reserve(self, header_size: Callable[[], int], data_size: int = 0, threads: int = 1) -> None:
        self.part_bytes = max(PART_BYTES, -(-data_size // (MAX_PARTS - 1)))  # S3's part limit
        self.upload.in_flight = parts_in_flight(threads)

    def write(self, data: bytes) -> None:
        self.position += len(data)
        view = memoryview(data)
        if len(self.first) < self.part_bytes:
            take = self.part_bytes - len(self.first)
            self.first += view[:take]
            view = view[take:]
        self.buffer += view
        while len(self.buffer) >= self.part_bytes:
            part = io.BytesIO()  # owning its bytes: the HTTP client reads it without a copy
            with memoryview(self.buffer) as filled:
                part.write(filled[: self.part_bytes])
            del self.buffer[: self.part_bytes]
            self.upload.put(self.number, part)
            del part
            self.number += 1

    def finish(self, header: bytes) -> None:
        stored, flags = store_header(header)
        self.reserved = len(stored)
        if self.buffer:  # the last part, the only one that may be small
            self.upload.put(self.number, io.BytesIO(self.buffer))
            self.buffer = bytearray()
        first = io.BytesIO(pack_prelude(stored, flags) + stored)
        first.seek(0, io.SEEK_END)
        first.write(self.first)
        self.first = bytearray()
        self.upload.commit(first)


@contextlib.contextmanager
def open_sink(path: str, storage_options: StorageOptions = None) -> Iterator[Sink]:
    """The sink of a save to ``path``, all or nothing: a local file (temporary name, fsync,
    rename), a streamed multipart upload on S3 (aborted on failure), or on other fsspec stores
    a local temporary file put whole at the end."""
    upload = remote_upload(path, storage_options)
    if upload is None:
        with atomic_write(path, storage_options) as handle:
            yield FileSink(handle)
        return
    try:
        yield StreamSink(upload)
    except BaseException:
        upload.abort()
        raise


def _header_estimate(
    header: dict[str, Any], leaves: list[Leaf], policy: Policy, base: Base | None,
    base_location: str | None, encoded: dict[int, _LeafPlan],
) -> Callable[[], int]:
    """A function that says about how many bytes the header will take as stored, with a margin,
    before its chunk tables are known: the header deflated (level 6, a little larger than the
    writer's 9) with plausible tables in their place.

    Chunk lengths are drawn between half and all of each chunk's raw size and the checksums at
    random (they are incompressible in the real table too), each tensor gets the widest of its
    candidate pipelines' indices and, against a base, a base reference (the modes' own records
    are in the plans already); a margin of 5% and 8 bytes a tensor covers what drawing cannot
    know. Writers pad the stored header up to this and move the data only when the header
    outgrows it, so the estimate sets the padding: 14.5 KB stored against 20 KB reserved for a
    306-tensor training state, where the widest numbers undeflated (the bound before) reserved
    99 KB. What it needs of the transformed leaves' plans is taken now: the writer pops them and
    drops their arrays as it goes, and a sink may call the function midway."""
    transformed = {
        index: (plan.pipeline, plan.chunk_bytes, dict(plan.extra),
                plan.array.numel() * plan.array.element_size())
        for index, plan in encoded.items() if plan.array is not None
    }

    def estimate() -> int:
        rng = np.random.default_rng(len(leaves))  # deterministic: the same state pads the same
        base_crcs = rng.integers(0, 1 << 32, len(leaves), dtype=np.uint64).tolist()
        draft: list[_LeafPlan] = []
        candidates: list[Pipeline] = []
        sizes = []
        for index, leaf in enumerate(leaves):
            if index in transformed:
                pipeline, chunk_bytes, extra, size = transformed[index]
            else:
                pipelines = [policy.pipeline_for(leaf)]
                extra = {}
                if base is not None and base.tensor(leaf.name) is not None:
                    pipelines += policy.delta_candidates(leaf)
                    extra = {"base": {"name": leaf.name, "crc": base_crcs[index]}}
                candidates += pipelines
                pipeline, chunk_bytes, size = pipelines[0], policy.chunk_bytes(leaf), leaf.nbytes
            draft.append(_LeafPlan(leaf, pipeline, chunk_bytes, [], extra=extra))
            sizes.append(size)
        counts = [-(-size // plan.chunk_bytes) for size, plan in zip(sizes, draft)]
        fractions = (0.5 + rng.random(sum(counts)) / 2).tolist()
        checksums = rng.integers(0, 1 << 32, 2 * sum(counts), dtype=np.uint64).tolist()
        first, offset = 0, 0  # the draft's first chunk entry of a tensor, its data offset
        for plan, size, count in zip(draft, sizes, counts):
            for k in range(count):
                raw = min(plan.chunk_bytes, size - k * plan.chunk_bytes)
                j = first + k
                plan.table.append([max(int(raw * fractions[j]), 1), checksums[2 * j],
                                   checksums[2 * j + 1]])
            plan.offset = offset
            first += count
            offset += sum(entry[0] for entry in plan.table)
        pipelines_table, entries, chunk = _leaf_entries(draft, extra_pipelines=candidates)
        for entry in entries:
            entry["pipeline"] = len(pipelines_table)  # the widest index
        full = {**header, "chunk": chunk, "pipelines": pipelines_table, "leaves": entries,
                "data_length": offset, "id": "0" * 32}
        if base is not None:
            full.update(base={"id": base.id, "path": base_location}, chain_depth=2**31)
        stored = min(len(zlib.compress(text := _header_json(full), 6)), len(text))
        return stored + stored // 20 + 8 * len(leaves) + 256

    return estimate


def _leaf_entries(
    plans: list[_LeafPlan], extra_pipelines: Sequence[Pipeline] = ()
) -> tuple[list[list[dict[str, Any]]], list[dict[str, Any]], int]:
    """The header's pipeline table, leaf entries and default chunk size.

    Each distinct pipeline config is stored once and leaves name it by index; a leaf states its
    chunk size only where it differs from the most common one."""
    table: list[list[dict[str, Any]]] = []
    index_of: dict[str, int] = {}
    by_object: dict[int, int] = {}  # policies share pipeline objects: serialize each once

    def index(pipeline: Pipeline) -> int:
        if id(pipeline) not in by_object:
            config = pipeline.get_config()
            key = json.dumps(config, sort_keys=True)
            if key not in index_of:
                index_of[key] = len(table)
                table.append(config)
            by_object[id(pipeline)] = index_of[key]
        return by_object[id(pipeline)]

    sizes = Counter(plan.chunk_bytes for plan in plans)
    chunk = sizes.most_common(1)[0][0] if sizes else DEFAULT_CHUNK_BYTES
    entries = []
    for plan in plans:
        leaf = plan.leaf
        entry: dict[str, Any] = {
            "dtype": leaf.dtype.name,
            "shape": list(leaf.shape),
            "pipeline": index(plan.pipeline),
            "offset": max(plan.offset, 0),
            "chunks": plan.table,
            **plan.extra,
        }
        if plan.chunk_bytes != chunk:
            entry["chunk"] = plan.chunk_bytes
        entries.append(entry)
    for pipeline in extra_pipelines:
        index(pipeline)
    return table, entries, chunk


@gc_paused()
def encode_state(
    state: Any,
    sink: Sink,
    *,
    mode: str = "lossless",
    threads: int | None = None,
    metadata: dict[str, Any] | None = None,
    path: str | None = None,
    progress: bool = False,
    source: dict[str, Any] | None = None,
    base: Base | None = None,
    base_location: str | None = None,
    keyframe_every: int | None = None,
    mode_options: dict[str, Any] | None = None,
    resumed: bool = False,
) -> SaveReport:
    """Compress ``state`` into ``sink``; the caller owns where the bytes end up.

    ``source`` describes the file the state was read from (see :mod:`ckptzip.sources`), so that
    ``ckptzip decompress`` can write it back in its own form. With a ``base``, tensors are coded
    against it where that is smaller, unless the chain would reach ``keyframe_every`` checkpoints,
    in which case this one becomes a standalone keyframe. ``base_location`` is how the header
    names the base file (a path relative to the new file's directory).
    """
    started = time.perf_counter()
    n_threads = resolve_threads(threads)
    user_metadata = _check_metadata(metadata)
    # a Prepared state was planned already: its mode, base and policy hold
    prepared = state if isinstance(state, Prepared) else prepare(
        state, mode=mode, base=base, keyframe_every=keyframe_every, mode_options=mode_options,
        progress=progress, resumed=resumed, threads=n_threads)
    mode, base, policy = prepared.mode, prepared.base, prepared.policy
    tree, leaves, encoded = prepared.tree, prepared.leaves, dict(prepared.encoded)
    header: dict[str, Any] = {
        "format": "ckz",
        "version": [FORMAT_MAJOR, FORMAT_MINOR],
        "creator": f"ckptzip {__version__}",
        "mode": mode,
        "metadata": user_metadata,
        "tree": tree,
    }
    if source is not None:
        header["source"] = source
    raw_total = sum(leaf.nbytes for leaf in leaves)
    # a stored chunk exceeds its raw bytes by its stream header at most (RAW planes)
    sink.reserve(_header_estimate(header, leaves, policy, base, base_location, encoded),
                 raw_total + raw_total // 256 + (64 << 10), n_threads)
    bar = Progress(raw_total, "compress", enabled=progress)

    plans: list[_LeafPlan] = []
    tasks = _tasks(leaves, policy, base, encoded, plans, task_bytes(raw_total, n_threads),
                   prepared.exact)
    for segments in ordered_map(functools.partial(_encode_task, plans), tasks, n_threads):
        for stored, entries in segments:
            position = sink.position
            sink.write(stored)
            for index, length, crc, raw_crc, raw_length in entries:
                plan = plans[index]
                if plan.offset < 0:
                    plan.offset = position
                position += length
                plan.table.append([length, crc, raw_crc])
                bar.update(raw_length)
                if len(plan.table) == plan.n_chunks:  # done with this tensor: free what it held
                    plan.base_raw = plan.array = plan.precoded = None
    bar.close()
    if base is not None and any("base" in plan.extra for plan in plans):
        header["base"] = {"id": base.id, "path": base_location}
        header["chain_depth"] = base.depth + 1
    header["pipelines"], header["leaves"], header["chunk"] = _leaf_entries(plans)
    header["data_length"] = sink.position
    # the id hashes the header without it; "id" goes last, so the JSON with it is that JSON with
    # one more member before the closing brace (no second encoding of a large header)
    body = _header_json(header)
    header["id"] = hashlib.sha256(body).hexdigest()[:32]
    sink.finish(body[:-1] + b',"id":"' + header["id"].encode() + b'"}')
    stored_total = PRELUDE_SIZE + sink.reserved + sink.position
    state_leaves = leaves[: len(leaves) - prepared.added]
    return SaveReport(path, sum(leaf.nbytes for leaf in state_leaves), stored_total,
                      time.perf_counter() - started, len(state_leaves), mode)
