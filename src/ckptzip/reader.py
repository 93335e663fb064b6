"""Reading a ``.ckz``: validate the prelude and header, then decode the chunks a caller asks for,
in parallel, checking each stored chunk's checksum before decoding it and each decoded chunk's
checksum after."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import torch

from . import _native
from .chain import Base, BaseTensor, MemoryBase, base_exists, resolve_relative, same_file
from .codecs import TransformContext, undo
from .container import PRELUDE_SIZE, ChunkRef, Header, LeafInfo, load_header, parse_prelude, parsed_header
from .dtypes import DType
from .errors import (
    BaseMismatchError,
    ConfigError,
    CorruptError,
    Error,
    FormatError,
    KeyNotFoundError,
    VersionError,
)
from .objstore import StorageOptions
from .parallel import ordered_map, resolve_threads, task_bytes
from .progress import Progress
from .storage import BytesSource, PathLike, Source, is_url, local_path, open_source
from .tree import TENSOR_KINDS, check_tree, leaf_refs, tensor_bytes, unflatten, unique_name

# leaf, chunk index, chunk, output slice, base slice (for residuals)
_Job = tuple[LeafInfo, int, ChunkRef, np.ndarray, np.ndarray | None]


@dataclass
class VerifyReport:
    path: str
    tensors: int
    chunks: int
    raw_bytes: int
    stored_bytes: int


class CheckpointFile:
    """A ``.ckz`` opened for reading; lazy like safetensors' ``safe_open``.

    ``keys()`` lists the tensors by dotted key path; ``get_tensor(key)`` decodes only that tensor's
    chunks; ``load()`` rebuilds the whole state.
    """

    def __init__(self, source: Source, *, threads: int | None = None, base: Any = None,
                 storage_options: StorageOptions = None) -> None:
        self.source = source
        self.name = source.name
        self.threads = resolve_threads(threads)
        self._base_arg = base
        #: How this file's bases on the same store are opened.
        self.storage_options = storage_options
        self._base: Base | None = None
        #: The files that opened this one as their base, the newest first (a loop check).
        self._opened_by: tuple[str, ...] = ()
        head = source.read(0, min(PRELUDE_SIZE, source.size))
        prelude = parse_prelude(bytes(head), source.size, self.name)
        header_bytes = bytes(source.read(PRELUDE_SIZE, prelude.header_length))
        if _native.crc32c(header_bytes) != prelude.header_crc:
            raise CorruptError(
                f"{self.name}: the header checksum does not match: the file is damaged; "
                f"restore it from another copy"
            )
        self.data_start = PRELUDE_SIZE + prelude.header_length
        header_json = load_header(header_bytes, prelude.flags, self.name)
        self.header: Header = parsed_header(header_json, source.size - self.data_start, self.name)
        self._keys: dict[str, dict[str, Any]] | None = None

    @classmethod
    def open(cls, path: PathLike, *, threads: int | None = None, base: Any = None,
             storage_options: StorageOptions = None) -> CheckpointFile:
        source = open_source(path, storage_options)
        try:
            return cls(source, threads=threads, base=base, storage_options=storage_options)
        except BaseException:
            source.close()
            raise

    # -- context management ---------------------------------------------------------------
    def close(self) -> None:
        if self._base is not None:
            self._base.close()
            self._base = None
        self.source.close()

    def __enter__(self) -> CheckpointFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- information ----------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, Any]:
        return self.header.metadata

    @property
    def mode(self) -> str:
        return self.header.mode

    @property
    def id(self) -> str:
        return self.header.id

    @property
    def leaves(self) -> tuple[LeafInfo, ...]:
        return self.header.leaves

    @property
    def chain_depth(self) -> int:
        """0 for a standalone checkpoint (a keyframe), else 1 + its base's depth."""
        return self.header.chain_depth

    @property
    def base_ref(self) -> dict[str, Any] | None:
        """The header's reference to the base this delta was coded against (None: keyframe)."""
        return self.header.base_ref

    def base(self) -> Base:
        """The base this delta needs: the ``base=`` given when opening, else the file its header
        names, looked up relative to this file. Checked against the recorded content id."""
        if self._base is not None:
            return self._base
        ref = self.header.base
        if ref is None:
            raise BaseMismatchError(f"{self.name}: not a delta checkpoint; it has no base")
        expected = ref.id
        base = open_base(self._base_arg, threads=self.threads, storage_options=self.storage_options)
        if base is None:
            location = ref.path
            if location is None:
                raise BaseMismatchError(
                    f"{self.name}: this delta was coded against an in-memory base (a state or "
                    f"a checkpoint's bytes) and needs it: pass that base as base= (a delta's "
                    f"bytes are no base by themselves: pass their decoded state, "
                    f"ckptzip.loads(delta, base=its_base))"
                )
            path = resolve_relative(self.name, location)
            if not base_exists(path):
                raise BaseMismatchError(
                    f"{self.name}: its base {location!r} (id {expected}) is missing: looked for "
                    f"{path}; put it back beside the delta or pass base=PATH (--base on the command "
                    f"line)"
                )
            for link in (*self._opened_by, self.name):
                if _one_file(path, link):
                    raise BaseMismatchError(
                        f"{self.name}: its base {location!r} is {link}, a file of its own chain, "
                        f"so the chain loops and never loads: the header is damaged or was "
                        f"crafted; restore the file from another copy")
            try:
                base = open_base(path, threads=self.threads, storage_options=self.storage_options)
            except Error as exc:
                raise _in_base(exc, self.name, location) from exc
            assert isinstance(base, FileBase)
            base.checkpoint._opened_by = (*self._opened_by, self.name)
        if expected is not None and base.id is not None and base.id != expected:
            found = base.location
            base.close()
            raise BaseMismatchError(
                f"{self.name}: its base must have id {expected}, but {found} has id {base.id}: "
                f"it is not the checkpoint this delta was coded against"
            )
        self._base = base
        return base

    def _key_nodes(self) -> dict[str, dict[str, Any]]:
        """Tensor nodes by dotted key path (``#2``, ``#3`` set colliding paths apart)."""
        if self._keys is None:
            self._keys = {}
            for path, node in leaf_refs(self.header.tree):
                if node["t"] not in TENSOR_KINDS:
                    continue
                self._keys[unique_name(path, self._keys)] = node
        return self._keys

    def keys(self) -> list[str]:
        """The state's tensors, as dotted key paths (``model.wte.weight``)."""
        return list(self._key_nodes())

    def __contains__(self, key: str) -> bool:
        return key in self._key_nodes()

    # -- decoding -------------------------------------------------------------------------
    def get_tensor(self, key: str, *, map_location: Any = "cpu") -> Any:
        """Decode one tensor (and nothing else) by its key path."""
        node = self._key_nodes().get(key)
        if node is None:
            raise KeyNotFoundError(f"{self.name}: no tensor {key!r}; keys() (or `ckptzip inspect "
                                   f"{self.name}`) lists them")
        return self._build(node, map_location)

    def load(self, *, map_location: Any = "cpu", progress: bool = False) -> Any:
        """The whole state, with the types and structure it was saved with."""
        return self._build(self.header.tree, map_location, progress=progress)

    def _build(self, node: Any, map_location: Any, progress: bool = False) -> Any:
        device = _device(map_location, self.name)  # before any decoding: a device torch lacks
        # an index of another type (a list, from a damaged header) is the builder's to refuse
        wanted = {i for _, n in leaf_refs(node) if type(i := n.get("i")) is int}
        valid = sorted(i for i in wanted if 0 <= i < len(self.leaves))
        decoded = self.read_leaves(valid, progress=progress)

        def get_leaf(index: int) -> torch.Tensor:
            if index not in decoded:  # referenced where leaf_refs does not look (a key, metadata)
                decoded.update(self.read_leaves([index]))
            return decoded[index]

        return unflatten(node, get_leaf, len(self.leaves), self.name, device)

    def read_leaves(self, indices: list[int], *, progress: bool = False) -> dict[int, torch.Tensor]:
        """Decode the given leaves in parallel into tensors of their dtype and shape (and the
        siblings their transforms read: a support, low-rank factors).

        A delta's leaves are decoded in batches of about :data:`BASE_BATCH_BYTES` of base
        tensors: each batch's base tensors are decoded together, in one parallel pass, and freed
        once its leaves are done, so that a load holds what it returns and one batch of the base
        beside it, not the whole base as well."""
        siblings = {j for i in indices for j in self.leaves[i].pipeline.references}
        indices = [*indices, *sorted(siblings.difference(indices))]
        if self.header.base is not None:
            _room_for_chain(self.chain_depth)
        bar = Progress(sum(self.leaves[i].array_nbytes for i in indices), "decompress",
                       enabled=progress)
        # siblings first: a leaf that reads siblings needs them decoded (the header parser
        # refused chains, so one pass over the rest follows)
        result: dict[int, torch.Tensor] = {}
        for reads_siblings in (False, True):
            batch = [i for i in indices
                     if bool(self.leaves[i].pipeline.references) == reads_siblings]
            for part in _base_batches(self.leaves, batch):
                self._read_batch(part, result, bar)
        bar.close()
        return result

    def _read_batch(self, indices: list[int], result: dict[int, torch.Tensor],
                    bar: Progress) -> None:
        """:meth:`read_leaves` for one batch of leaves, into ``result``: their base tensors
        decoded, their chunks decoded into new buffers on the thread pool, their transforms
        undone (on the pool too), and the base tensors freed. The buffers are taken once the
        base tensors are decoded: down a chain, every link's buffers would otherwise be held
        while the links below it decode (a load held a copy of the state per link)."""
        bases: dict[int, np.ndarray] = {}
        jobs: list[_Job] = []
        self._prefetch_bases([self.leaves[i] for i in indices if self.leaves[i].is_delta])
        for i in indices:
            leaf = self.leaves[i]
            if leaf.is_delta:
                # a chunk-level residual decodes to the bytes its raw CRC covers, so a wrong base
                # shows there and its own CRC is checked only then; transforms need it checked now
                bases[i] = self._base_raw(leaf, check=bool(leaf.pipeline.transforms)
                                          or not leaf.pipeline.needs_base)
        try:
            buffers = {i: output_buffer(self.leaves[i].array_nbytes) for i in indices}
        except (RuntimeError, MemoryError) as exc:  # more than this host can map
            wanted = sum(self.leaves[i].array_nbytes for i in indices)
            raise Error(f"{self.name}: its tensors declare {wanted} bytes, which this host cannot "
                        f"allocate ({str(exc).splitlines()[0][:120]})") from None
        for i in indices:
            leaf = self.leaves[i]
            out = buffers[i].numpy()
            chunk_base = bases.get(i) if leaf.pipeline.needs_base else None
            for k, chunk in enumerate(leaf.chunks):
                start = k * leaf.chunk_bytes
                end = start + chunk.raw_length
                jobs.append((leaf, k, chunk, out[start:end],
                             None if chunk_base is None else chunk_base[start:end]))
        total = sum(self.leaves[i].array_nbytes for i in indices)
        tasks = list(_group(jobs, task_bytes(total, self.threads)))
        self.source.expect([(self.data_start + task[0][2].offset,
                             task[-1][2].offset + task[-1][2].length - task[0][2].offset)
                            for task in tasks], self.threads)
        try:
            for done in ordered_map(self._decode_task, tasks, self.threads):
                bar.update(done)
        except _DeltaFailed as failed:
            # a wrong base, not damage, when the base's CRC (unchecked so far) differs
            i = next(i for i in bases if self.leaves[i] is failed.leaf)
            self._verify_base(failed.leaf, bases[i])
            raise failed.damaged from None

        def finish(i: int) -> tuple[int, torch.Tensor]:
            pipeline = self.leaves[i].pipeline
            sibling = pipeline.support
            support = None if sibling is None else result[sibling] != 0
            decoded = {j: result[j] for j in pipeline.references}
            return i, self._finish_leaf(self.leaves[i], buffers[i], bases.get(i), support,
                                        decoded)

        # the leaves of a batch are independent and finish on the thread pool
        threads = self.threads if any(self.leaves[i].pipeline.transforms for i in indices) else 1
        result.update(ordered_map(finish, indices, threads, torch_ops=True))
        if self._base is not None:  # each base tensor serves one tensor here: free it
            for i in bases:
                name = self.leaves[i].base_name
                assert name is not None  # _base_raw found it
                self._base.release(name)

    def _finish_leaf(self, leaf: LeafInfo, buffer: torch.Tensor, base: np.ndarray | None,
                     support: torch.Tensor | None = None,
                     siblings: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
        """View decoded bytes as the stored array, then undo whole-tensor transforms."""
        tensor = _typed(buffer, leaf.array_dtype, leaf.array_shape)
        if not leaf.pipeline.transforms:
            return tensor
        base_tensor = None
        if base is not None:  # from_numpy gives an empty array a zero stride, which view refuses
            flat = torch.from_numpy(base) if base.size else torch.empty(0, dtype=torch.uint8)
            base_tensor = _typed(flat, leaf.dtype, leaf.shape)
        context = TransformContext(leaf.name, base_tensor, support, siblings)
        try:
            tensor = undo(leaf.pipeline.transforms, tensor, context)
        except (ValueError, RuntimeError, IndexError) as exc:
            raise CorruptError(
                f"{self.name}: tensor {leaf.name!r}: cannot undo its transforms: {exc}"
            ) from None
        if tensor.dtype != leaf.dtype.torch_dtype or tuple(tensor.shape) != leaf.shape:
            raise CorruptError(
                f"{self.name}: tensor {leaf.name!r} decodes to {tensor.dtype}{list(tensor.shape)}, "
                f"not the {leaf.dtype.name}{list(leaf.shape)} its header declares"
            )
        return tensor

    def _decode_task(self, jobs: list[_Job]) -> int:
        first, last = jobs[0][2], jobs[-1][2]
        span = self.source.read_scratch(self.data_start + first.offset,
                                        last.offset + last.length - first.offset)
        view = memoryview(span)
        # runs of chunks the native core decodes whole go to it in one call each (the GIL
        # released once, checksums included); the others (Python stages) one by one
        batch: list[tuple[int, int, int, np.ndarray, np.ndarray | None, int, int, int, int, int]] = []
        batch_jobs: list[_Job] = []
        for job in jobs:
            leaf, k, chunk, out, base = job
            spec = leaf.pipeline.native_spec(base is not None)
            if spec is not None:
                batch.append((chunk.offset - first.offset, chunk.length, chunk.crc, out,
                              base if leaf.pipeline.needs_base else None, *spec,
                              chunk.raw_crc))
                batch_jobs.append(job)
                continue
            self._decode_batch(view, batch, batch_jobs)
            stored = view[chunk.offset - first.offset : chunk.offset - first.offset + chunk.length]
            if _native.crc32c(stored) != chunk.crc:
                raise self._damaged(leaf, k, "stored bytes fail their checksum")
            try:
                leaf.pipeline.decode_chunk(stored, out, base)
            except CorruptError as exc:
                self._fail(leaf, self._damaged(leaf, k, str(exc)), base)
            if _native.crc32c(out) != chunk.raw_crc:
                self._fail(leaf, self._damaged(leaf, k, "decoded bytes fail their checksum"), base)
        self._decode_batch(view, batch, batch_jobs)
        return sum(len(job[3]) for job in jobs)

    def _decode_batch(self, view: memoryview, batch: list[Any], batch_jobs: list[_Job]) -> None:
        """Decode (and empty) a batch of :meth:`_decode_task`, raising as it would for the first
        chunk that fails."""
        if not batch:
            return
        failed = _native.decode_chunks(view, batch)
        jobs = list(batch_jobs)
        batch.clear()
        batch_jobs.clear()
        if failed is None:
            return
        position, what, message = failed
        leaf, k, _, _, base = jobs[position]
        if what == 0:
            raise self._damaged(leaf, k, "stored bytes fail their checksum")
        if what == 1 and message.startswith(NEWER_STREAM):  # its stored checksum held
            raise VersionError(f"{self._chunk_where(leaf, k)}: {message}, and its checksum "
                               f"holds: a newer ckptzip wrote it; upgrade ckptzip (pip install -U "
                               f"ckptzip) to read it")
        self._fail(leaf, self._damaged(leaf, k, message if what == 1
                                       else "decoded bytes fail their checksum"), base)

    @staticmethod
    def _fail(leaf: LeafInfo, damaged: CorruptError, base: np.ndarray | None) -> NoReturn:
        if base is not None:  # read_leaves checks the base before it blames the file
            raise _DeltaFailed(leaf, damaged) from None
        raise damaged from None

    def _prefetch_bases(self, leaves: list[LeafInfo]) -> None:
        """Decode the base tensors of these delta leaves in one pass (see Base.prefetch); the
        checks and errors stay with _base_raw, which then finds them decoded."""
        if not leaves:
            return
        base = self.base()
        names = [name for leaf in leaves if (name := leaf.base_name) is not None]
        try:
            base.prefetch(names)
        except Error as exc:
            raise _in_base(exc, self.name, base.location or "the base") from exc

    def _base_raw(self, leaf: LeafInfo, *, check: bool = True) -> np.ndarray:
        """The raw bytes of the base tensor a delta leaf was coded against, checked by CRC
        unless ``check`` is false (the caller then checks the decoded bytes' CRC instead)."""

        name = leaf.base_name
        if name is None:
            raise FormatError(f"{self.name}: tensor {leaf.name!r} has a residual but no base reference")
        base = self.base()
        found = base.tensor(name)
        if found is None or found.dtype != leaf.dtype or found.shape != leaf.shape:
            raise BaseMismatchError(
                f"{self.name}: tensor {leaf.name!r} needs base tensor {name!r} of "
                f"{leaf.dtype.name}{list(leaf.shape)}, which {base.location or 'the base'} lacks; "
                f"it is not the base this delta was coded against"
            )
        try:
            raw = base.raw(name)
        except Error as exc:
            raise _in_base(exc, self.name, base.location or "the base") from exc
        if check:
            self._verify_base(leaf, raw)
        return raw

    def _verify_base(self, leaf: LeafInfo, raw: np.ndarray) -> None:
        if _native.crc32c(raw) != leaf.base_crc:
            raise BaseMismatchError(
                f"{self.name}: tensor {leaf.name!r}: the base tensor's content differs from the one "
                f"it was coded against (CRC mismatch); pass the right base"
            )

    def _damaged(self, leaf: LeafInfo, k: int, what: str) -> CorruptError:
        return CorruptError(f"{self._chunk_where(leaf, k)}: {what}: the file is damaged; "
                            f"restore it from another copy")

    def _chunk_where(self, leaf: LeafInfo, k: int) -> str:
        """A chunk, as messages name it: the file, the tensor, the chunk and its bytes."""
        chunk = leaf.chunks[k]
        return (f"{self.name}: tensor {leaf.name!r}, chunk {k} (data bytes {chunk.offset}+"
                f"{chunk.length})")

    def verify(self) -> VerifyReport:
        """Check every checksum by decoding every chunk, and the tree as a load builds it;
        raises :class:`CorruptError` on damage, :class:`FormatError` on a tree a load refuses."""
        check_tree(self.header.tree,
                   [(leaf.dtype.torch_dtype or torch.uint8, leaf.shape) for leaf in self.leaves],
                   self.name)
        for i in range(len(self.leaves)):
            self.read_leaves([i])
        return VerifyReport(
            self.name, len(self.leaves), sum(len(leaf.chunks) for leaf in self.leaves),
            sum(leaf.nbytes for leaf in self.leaves), self.source.size,
        )


#: How the native decoders' message begins for a stream whose format byte they do not know
#: (core/stream.c, core/ctx_decode.c): in a chunk whose stored checksum holds, a newer writer's.
NEWER_STREAM = "stream format byte is "
#: Python frames a chain's decoding takes per link, with room to spare (about 3 are used).
FRAMES_PER_LINK = 8


def _room_for_chain(depth: int) -> None:
    """Raise Python's recursion limit (never lower it) so that a chain of ``depth`` links
    decodes: each link decodes its base's tensors from within its own read. Saves keep chains
    within ``planning.MAX_CHAIN`` links; a file written deeper still loads."""
    needed = 1000 + FRAMES_PER_LINK * min(depth, 1024)  # a header's depth is not trusted
    if sys.getrecursionlimit() < needed:
        sys.setrecursionlimit(needed)


def _one_file(a: str, b: str) -> bool:
    """Whether two files of a chain are one (its loop): local ones by inode, whatever their
    names (links included); URLs normalised (``chain.same_file``); in-memory ones by name."""
    if a.startswith("<") or b.startswith("<"):
        return a == b
    if not (is_url(a) or is_url(b)):
        try:
            return os.path.samestat(os.stat(local_path(a)), os.stat(local_path(b)))
        except OSError:
            pass
    return same_file(a, b)


def _in_base(exc: Error, delta: str, base: str) -> Error:
    """``exc``, raised by the base of ``delta``, as the same kind of error naming ``delta`` too
    (a load of the newest file of a chain then names it, whichever link failed)."""
    return type(exc)(f"{delta}: its base {base} cannot be read: {exc}")


#: Decoded tensors at least this large get memory of their own with huge pages advised.
PAGE_BUFFER_BYTES = 2 << 20
#: Base tensors a delta's load decodes at once, in raw bytes (:func:`_base_batches`). A batch
#: is decoded in one parallel pass, so a larger one keeps more threads busy at its end; a
#: smaller one holds less memory beside the loaded state.
BASE_BATCH_BYTES = 256 << 20


def output_buffer(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` for a decoded tensor to be written into.

    From ``PAGE_BUFFER_BYTES`` on it is a ``_native.PageBuffer``, whose 2 MiB pages take one
    fault each on the first write instead of 512: on a VM, faulting in fresh 4 KiB pages costs
    as long as decoding into them (docs/BENCHMARKS.md, "Page faults"). The tensor keeps the
    buffer alive and behaves like any other (its storage cannot grow, as with torch.frombuffer).
    """
    if nbytes < PAGE_BUFFER_BYTES:
        return torch.empty(nbytes, dtype=torch.uint8)
    return torch.frombuffer(_native.PageBuffer(nbytes), dtype=torch.uint8)


def _typed(buffer: torch.Tensor, dtype: DType, shape: tuple[int, ...]) -> torch.Tensor:
    """Raw little-endian bytes (a uint8 tensor) viewed as ``dtype`` and ``shape``."""
    torch_dtype = dtype.torch_dtype
    assert torch_dtype is not None  # every dtype name a header may hold maps to a torch dtype
    return buffer.view(torch_dtype).reshape(shape)


class _DeltaFailed(Exception):
    """A chunk coded against a base failed to decode, before that base's CRC was checked."""

    def __init__(self, leaf: LeafInfo, damaged: CorruptError) -> None:
        super().__init__(str(damaged))
        self.leaf, self.damaged = leaf, damaged


def _base_batches(leaves: tuple[LeafInfo, ...], indices: list[int]) -> Iterator[list[int]]:
    """``indices`` in order, cut into batches whose delta leaves' base tensors come to about
    :data:`BASE_BATCH_BYTES` (a larger tensor is a batch of its own); a file without a base is
    one batch."""
    batch: list[int] = []
    held = 0
    for i in indices:
        weight = leaves[i].nbytes if leaves[i].is_delta else 0
        if batch and held + weight > BASE_BATCH_BYTES:
            yield batch
            batch, held = [], 0
        batch.append(i)
        held += weight
    if batch:
        yield batch


def _group(jobs: list[_Job], size_limit: int) -> Iterator[list[_Job]]:
    """Consecutive chunks that lie back to back in the file, about ``size_limit`` raw bytes each."""
    task: list[_Job] = []
    size = 0
    for job in jobs:
        if task:
            previous = task[-1][2]
            if previous.offset + previous.length != job[2].offset or size >= size_limit:
                yield task
                task, size = [], 0
        task.append(job)
        size += len(job[3])
    if task:
        yield task


def _device(map_location: Any, name: str) -> torch.device | None:
    """The device ``map_location`` names (None: where the tensors are decoded, the host), once
    torch has shown it can place a tensor there."""
    if map_location is None:
        return None
    try:
        device = torch.device(map_location)
    except (RuntimeError, TypeError):
        raise Error(f"map_location must be a device or device string, not {map_location!r}") from None
    if device.type == "cpu":
        return None
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:  # a CPU-only torch asserts for CUDA
        raise Error(f"{name}: cannot load onto {device} ({error}); pass map_location='cpu', or "
                    f"a device this process has") from None
    return device


class FileBase(Base):
    """An earlier ``.ckz`` (itself possibly a delta: its own base is resolved the same way)."""

    def __init__(self, checkpoint: CheckpointFile, *, owned: bool) -> None:
        super().__init__()
        self.checkpoint = checkpoint
        self.owned = owned
        self.id = checkpoint.id
        self.depth = checkpoint.chain_depth
        self.location = checkpoint.name
        self._index = {leaf.name: leaf for leaf in checkpoint.leaves}
        # one decode at a time: a lossy save's groups, looked at on the thread pool, may each
        # ask for a base tensor, and the file's reads and read-ahead are one caller's
        self._decoding = threading.RLock()

    def tensor(self, name: str) -> BaseTensor | None:
        leaf = self._index.get(name)
        return None if leaf is None else BaseTensor(name, leaf.dtype, leaf.shape)

    def stored(self, name: str) -> LeafInfo | None:
        return self._index.get(name)

    def _load(self, name: str) -> np.ndarray:
        index = self._index[name].index
        with self._decoding:
            return tensor_bytes(self.checkpoint.read_leaves([index])[index])

    def differs(self, name: str, data: np.ndarray) -> bool:
        """Whether ``data`` differs from the tensor ``name`` this file decodes to, from the
        header alone: a tensor stored without whole-tensor transforms decodes to its chunks' raw
        bytes, whose CRC-32Cs the header holds, so one chunk of ``data`` with another CRC
        proves a difference (a lossy save's unchanged-tensor check, which then decodes only the
        tensors that may be the same). False where it cannot tell: a lossy tensor, one already
        decoded (compared at no cost), or every CRC equal (only the bytes can say then)."""
        leaf = self._judged_by_crc(name)
        return leaf is not None and data.size == leaf.nbytes and not leaf.holds_raw(data)

    def head_bytes(self, name: str) -> int:
        """A decoded tensor's (see :meth:`Base.head_bytes`), or the first chunk's of one stored
        without whole-tensor transforms: the header holds that chunk's CRC-32C."""
        leaf = self._judged_by_crc(name)
        if leaf is None or not leaf.chunks:
            return super().head_bytes(name)
        return leaf.chunks[0].raw_length

    def head_differs(self, name: str, head: np.ndarray) -> bool:
        leaf = self._judged_by_crc(name)
        if leaf is None or not leaf.chunks:
            return super().head_differs(name, head)
        return (head.size == leaf.chunks[0].raw_length
                and _native.crc32c(head) != leaf.chunks[0].raw_crc)

    def _judged_by_crc(self, name: str) -> LeafInfo | None:
        """The header's record of ``name`` where its chunks' raw CRC-32Cs judge the tensor's bytes
        (stored without whole-tensor transforms) and it is not decoded yet (the bytes at hand
        are compared instead); else None."""
        leaf = self._index.get(name)
        if leaf is None or name in self._cache or leaf.pipeline.transforms:
            return None
        return leaf

    def prefetch(self, names: list[str]) -> None:
        # one read_leaves over every tensor wanted: its chunks spread over all the threads, where
        # tensor after tensor a small tensor's few chunks kept most of them idle
        wanted = {self._index[name].index: name for name in names
                  if name in self._index and name not in self._cache}
        if len(wanted) < 2:
            return
        with self._decoding:
            decoded = self.checkpoint.read_leaves(sorted(wanted))
        for index, tensor in decoded.items():
            if index in wanted:
                self._cache[wanted[index]] = tensor_bytes(tensor)

    def close(self) -> None:
        super().close()
        if self.owned:
            self.checkpoint.close()


def chain_files(base: Base | None) -> Iterator[str]:
    """Where the files a delta coded against ``base`` reads lie: ``base`` itself, then each
    link of its own chain, nearest first, opened as a load opens them (and kept open for the
    save's decoding). Ends at a keyframe, an in-memory base, or a link that cannot be opened
    (the decoding reports that one)."""
    while isinstance(base, FileBase):
        if base.location is not None:
            yield base.location
        if base.checkpoint.header.base is None:
            return
        try:
            base = base.checkpoint.base()
        except Error:
            return


def refuse_writing_over_chain(target: str, base: Base | None, what: str = "this delta") -> None:
    """A file written over a link of ``base``'s chain replaces a file that chain reads: the
    later links lose their base (their header names its id), and so does the new file, whose
    base needs them. Every checkpoint of the chain would be lost while the save succeeds, so it
    is refused before anything is written."""
    for location in chain_files(base):
        if same_file(target, location):
            first = base is not None and location == base.location
            raise ConfigError(
                f"{target}: is {'the base' if first else 'a link of the base chain'} {what} "
                f"is coded against ({location}); writing over it would leave every checkpoint "
                f"of that chain, and {what}, without its base. Write to a new path (the next "
                f"step's file)")


def open_base(base: Any, *, threads: int | None = None,
              storage_options: StorageOptions = None) -> Base | None:
    """Turn a user's ``base=`` (a path or URL, bytes of a .ckz, an open CheckpointFile, a Base, or
    an in-memory state) into a :class:`Base`; a URL is opened with ``storage_options``."""
    if base is None or isinstance(base, Base):
        return base
    if isinstance(base, CheckpointFile):
        return FileBase(base, owned=False)
    if isinstance(base, (str, os.PathLike)):
        if not base_exists(base):
            raise BaseMismatchError(f"base {os.fspath(base)}: no such checkpoint")
        return FileBase(CheckpointFile.open(base, threads=threads, storage_options=storage_options),
                        owned=True)
    if isinstance(base, (bytes, bytearray, memoryview)):
        return FileBase(CheckpointFile(BytesSource(base, "<base bytes>"), threads=threads), owned=True)
    return MemoryBase(base)
