"""Encoding a state into a ``.ckz`` container: plan it (:mod:`ckptzip.planning`), compress
its chunks in parallel, and write them in order into a sink (:mod:`ckptzip.sinks`) behind the
header (:mod:`ckptzip.container`)."""

from __future__ import annotations

import functools
import itertools
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .chain import Base
from .container import (
    HEADER_DEFLATE_LEVEL,
    PRELUDE_SIZE,
    add_base,
    base_entry,
    check_metadata,
    draft_header,
    finish_header,
    new_header,
    refers_to_base,
)
from .parallel import gc_paused, ordered_map, resolve_threads, task_bytes
from .pipeline import Coded, Pipeline, code_chunks
from .planning import LeafPlan, Prepared, has_base_tensor, plan_leaf, prepare
from .policy import Exact, Policy
from .progress import Progress
from .sinks import Sink
from .tree import Leaf, leaf_paths, tensor_bytes


@dataclass
class SaveReport:
    """What a save did: sizes in bytes and wall seconds."""

    path: str | None
    raw_bytes: int
    stored_bytes: int
    seconds: float
    tensors: int
    mode: str
    #: The file's content id (what :attr:`ckptzip.CheckpointFile.id` reads back).
    id: str = ""
    #: Stored bytes of the tensor (or array, or bytes) at each dotted key path of the state, as
    #: :func:`ckptzip.tree.leaf_paths` names them; several paths sharing storage count it each.
    stored_bytes_at: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes if self.stored_bytes else float("inf")

    def __str__(self) -> str:
        return (
            f"{self.path or '<memory>'}: {self.raw_bytes:,} -> {self.stored_bytes:,} bytes "
            f"({self.ratio:.3f}x) in {self.seconds:.2f}s"
        )


#: (leaf index, raw chunk, base chunk); a leaf whose chunks are coded already (``coded``) is
#: one item, (leaf index, None, None).
_Task = list[tuple[int, np.ndarray | None, np.ndarray | None]]


def _tasks(
    leaves: list[Leaf], policy: Policy, base: Base | None, encoded: dict[int, LeafPlan],
    plans: list[LeafPlan], size_limit: int, exact: dict[int, Exact] | None = None,
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
        raw = None
        if index in encoded:
            plan = encoded.pop(index)
        else:
            raw = leaf.host_bytes()
            plan = plan_leaf(leaf, raw, policy, base, (exact or {}).get(index))
        plans.append(plan)
        if base is not None:
            base.release(leaf.name)
        if plan.coded is not None:  # its chunks are one item (a precoded array is a meta tensor)
            task.append((index, None, None))
            continue
        if raw is None:
            assert plan.array is not None  # every encoded plan carries its array
            raw = tensor_bytes(plan.array)
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


def _encode_task(plans: list[LeafPlan], task: _Task) -> list[_Segment]:
    """Code a task's chunks (on a pool thread): runs of chunks the native core codes whole go
    to it in one call each (:func:`~ckptzip.pipeline.code_chunks`, the GIL released once),
    pipelines with Python stages one by one; a leaf coded already is taken as it is."""
    segments: list[_Segment] = []
    batch: list[tuple[np.ndarray, np.ndarray | None, int, int, int, int]] = []
    batch_leaves: list[int] = []

    def add(leaves: Iterable[int], coded: Coded) -> None:
        stored, chunks = coded
        segments.append((stored, [(index, *chunk) for index, chunk in zip(leaves, chunks)]))

    def flush() -> None:
        if batch:
            add(batch_leaves, code_chunks(batch))
            batch.clear()
            batch_leaves.clear()

    for index, raw, base_chunk in task:
        plan = plans[index]
        if raw is None:
            assert plan.coded is not None
            flush()
            add(itertools.repeat(index), plan.coded)
            continue
        pipeline = plan.pipeline
        spec = pipeline.native_spec(base_chunk is not None)
        if spec is not None:
            batch.append((raw, base_chunk if pipeline.needs_base else None, *spec))
            batch_leaves.append(index)
            continue
        flush()
        add((index,), pipeline.encode_whole(raw, base_chunk))
    flush()
    return segments


#: Raw bytes of base tensors a delta save decodes in one pass, at most (beyond one tensor): a
#: file base decodes them with all threads at once, and holds only this much ahead.
PREFETCH_BYTES = 64 << 20


def _prefetch_base(leaves: list[Leaf], start: int, base: Base, encoded: dict[int, LeafPlan]) -> int:
    """Have the base tensors of the leaves from ``start`` on at hand, up to PREFETCH_BYTES of
    them (a file base decodes them in one pass); returns the first leaf not covered."""
    names: list[str] = []
    size, end = 0, start
    while end < len(leaves) and (not names or size + leaves[end].nbytes <= PREFETCH_BYTES):
        leaf = leaves[end]
        if end not in encoded and has_base_tensor(leaf, base):
            names.append(leaf.name)
            size += leaf.nbytes
        end += 1
    base.prefetch(names)
    return end


def _data_bound(leaves: list[Leaf], encoded: dict[int, LeafPlan]) -> int:
    """The most bytes the data section takes, about (the sink's hint): a precoded leaf's stored
    bytes, a transformed leaf's array, every other leaf's raw bytes; a stored chunk exceeds its
    raw bytes by its stream header at most (RAW planes)."""
    coded = raw = 0
    for index, leaf in enumerate(leaves):
        plan = encoded.get(index)
        if plan is not None and plan.coded is not None:
            coded += len(plan.coded[0])
        else:
            raw += leaf.nbytes if plan is None else plan.raw_bytes
    return coded + raw + raw // 256 + (64 << 10)


def _header_estimate(
    header: dict[str, Any], leaves: list[Leaf], policy: Policy, base: Base | None,
    base_location: str | None, encoded: dict[int, LeafPlan],
) -> Callable[[], int]:
    """A function that says about how many bytes the header will take as stored, with a margin,
    before its chunk tables are known: the header deflated (at the writer's level,
    ``container.HEADER_DEFLATE_LEVEL``) with plausible tables in their place.

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
        index: (plan.pipeline, plan.chunk_bytes, dict(plan.extra), plan.raw_bytes)
        for index, plan in encoded.items() if plan.array is not None
    }

    def estimate() -> int:
        rng = np.random.default_rng(len(leaves))  # deterministic: the same state pads the same
        base_crcs = rng.integers(0, 1 << 32, len(leaves), dtype=np.uint64).tolist()
        draft: list[LeafPlan] = []
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
                    extra = base_entry(leaf.name, base_crcs[index])
                candidates += pipelines
                pipeline, chunk_bytes, size = pipelines[0], policy.chunk_bytes(leaf), leaf.nbytes
            draft.append(LeafPlan(leaf, pipeline, chunk_bytes, [], extra=extra))
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
        text = draft_header(header, draft, offset, candidates, None if base is None else base.id,
                            base_location, base is not None)
        stored = min(len(zlib.compress(text, HEADER_DEFLATE_LEVEL)), len(text))
        return stored + stored // 20 + 8 * len(leaves) + 256

    return estimate


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
    user_metadata = check_metadata(metadata)
    # a Prepared state was planned already: its mode, base and policy hold
    prepared = state if isinstance(state, Prepared) else prepare(
        state, mode=mode, base=base, keyframe_every=keyframe_every, mode_options=mode_options,
        progress=progress, resumed=resumed, threads=n_threads)
    mode, base, policy = prepared.mode, prepared.base, prepared.policy
    tree, leaves, encoded = prepared.tree, prepared.leaves, dict(prepared.encoded)
    header = new_header(mode, user_metadata, tree, source)
    raw_total = sum(leaf.nbytes for leaf in leaves)
    sink.reserve(_header_estimate(header, leaves, policy, base, base_location, encoded),
                 _data_bound(leaves, encoded), n_threads)
    bar = Progress(raw_total, "compress", enabled=progress)

    plans: list[LeafPlan] = []
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
                    plan.base_raw = plan.array = plan.coded = None
    bar.close()
    if base is not None and any(refers_to_base(plan.extra) for plan in plans):
        add_base(header, base.id, base_location, base.depth + 1)
    body, file_id = finish_header(header, plans, sink.position)
    sink.finish(body)
    stored_total = PRELUDE_SIZE + sink.reserved + sink.position
    state_leaves = leaves[: len(leaves) - prepared.added]
    leaf_stored = [sum(entry[0] for entry in plan.table) for plan in plans]
    return SaveReport(path, sum(leaf.nbytes for leaf in state_leaves), stored_total,
                      time.perf_counter() - started, len(state_leaves), mode, file_id,
                      {name: leaf_stored[i] for name, i in leaf_paths(tree).items()})
