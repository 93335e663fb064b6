"""ckptzip as the storage layer of PyTorch Distributed Checkpoint (``torch.distributed.checkpoint``).

DCP plans what each rank saves; these classes decide where the bytes go. Every rank writes ONE
``.ckz`` holding all its items (tensor shards and pickled objects), keyed by DCP's storage key
(``fqn@offsets``), coded with ckptzip's tensor-aware pipelines on the rank's own threads, so all
ranks compress in parallel. The coordinator then writes DCP's own ``.metadata`` last, as
``FileSystemWriter`` does: a checkpoint directory without it is not a checkpoint.

>>> import torch.distributed.checkpoint as dcp
>>> from ckptzip.dcp import CompressedReader, CompressedWriter
>>> dcp.save(state, storage_writer=CompressedWriter("ckpt/step-100"))  # doctest: +SKIP
>>> dcp.load(state, storage_reader=CompressedReader("ckpt/step-100"))  # doctest: +SKIP

Loading reshards like any DCP checkpoint: the reader serves each read request from the stored
shard that holds it, narrowed to the requested offsets and lengths.

A URL path (``s3://bucket/ckpt/step-100``) works as with torch's ``FsspecWriter``/``FsspecReader``:
``storage_options`` go to its fsspec filesystem; each rank streams its ``.ckz`` to the store
(:func:`ckptzip.save`) and ``.metadata`` goes through torch's fsspec file system.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint._fsspec_filesystem import FileSystem as FsspecFileSystem
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from .api import save
from .chain import same_file
from .errors import BaseMismatchError, ConfigError, Error, FormatError
from .held import HeldCheckpoint, PendingHold, hold_written_soon, open_held_base, settle, worth_holding
from .modes import policy_for
from .objstore import StorageOptions
from .parallel import local_ranks, rank_threads, resolve_threads
from .reader import CheckpointFile
from .storage import exists, is_url
from .tree import flat_items, flat_tree, flatten, leaf_index, unflatten

__all__ = ["CompressedReader", "CompressedWriter", "RankFile"]

#: Suffix of the per-rank files.
SUFFIX = ".ckz"
#: DCP's commit marker (written last, by the coordinator).
METADATA_FILE = ".metadata"
#: Raw bytes of stored items decoded together when loading: enough chunks to keep every thread
#: busy, few enough that a rank never holds much more than this beside its state.
READ_BATCH_BYTES = 64 << 20


@dataclass(frozen=True)
class RankFile:
    """Where DCP items lie: the rank file that holds them (each under :func:`item_key`) and its
    content id, checked on load so that a ``.metadata`` never serves a file from another save.
    All items of a file share one instance, so ``.metadata`` pickles it once per rank."""

    relative_path: str
    file_id: str


def item_key(index: MetadataIndex) -> str:
    """The key of a DCP item inside its rank file: ``fqn@offsets`` for tensor shards (so that a
    rank's delta finds the same shard in its previous file), the bare fqn for objects."""
    if index.offset is None:
        return index.fqn
    return f"{index.fqn}@{','.join(str(o) for o in index.offset)}"


def _committed(directory: str, rank: int | None, storage_options: StorageOptions = None) -> bool:
    """Whether a DCP checkpoint directory holds its commit marker (global or rank-local)."""
    names = [METADATA_FILE] + ([] if rank is None else [f"__{rank}{METADATA_FILE}"])
    return any(exists(os.path.join(directory, name), storage_options) for name in names)


class _OptionsFileSystem(FsspecFileSystem):
    """torch's fsspec file system for DCP, which remembers the storage options (torch's own
    passes them to the first ``init_path`` only, not to a ``reset(checkpoint_id)``'s)."""

    def __init__(self, storage_options: StorageOptions) -> None:
        super().__init__()
        self.options = dict(storage_options or {})

    def init_path(self, path: str | os.PathLike[str], **kwargs: Any) -> str | os.PathLike[str]:
        return super().init_path(path, **{**self.options, **kwargs})


def _on_store(storage: FileSystemWriter | FileSystemReader, path: str | os.PathLike[str],
              storage_options: StorageOptions) -> None:
    """Route a DCP writer's or reader's own files (``.metadata``) through fsspec when ``path``
    is a URL, as torch's FsspecWriter and FsspecReader do."""
    if is_url(path):
        storage.fs = _OptionsFileSystem(storage_options)  # type: ignore[assignment]  # as FsspecWriter
        storage.path = storage.fs.init_path(os.fspath(path))


#: The newest rank file this process wrote, as decoded, by the folder its checkpoints are in and
#: its name (``ckpt``, ``__0_0.ckz``): the next save coded against that file takes its base's
#: tensors from here instead of decoding its chain (ckptzip.held; CompressedWriter's
#: ``cache_decoded``).
_HELD: dict[tuple[str, str], HeldCheckpoint | PendingHold] = {}
_HELD_LOCK = threading.Lock()


def forget_held() -> None:
    """Free what this process holds of its newest DCP checkpoints as decoded (one rank file's
    state per run folder): their next deltas decode their bases again."""
    with _HELD_LOCK:
        _HELD.clear()


class CompressedWriter(FileSystemWriter):
    """A DCP ``StorageWriter`` that compresses each rank's items into one ``.ckz`` per rank.

    ``mode`` is a ckptzip mode (``"lossless"``: bit-exact). ``base`` names an earlier checkpoint
    directory written by this class: each rank then codes its tensors against its own file there
    (same rank, same shard key), and loading needs that directory kept where it is relative to
    this one. ``keyframe_every`` bounds such chains as in :func:`ckptzip.save`. Each process
    holds the newest file it wrote as decoded, so its next delta needs no decode of its chain
    (``cache_decoded``: None, the default, while the node's ranks' states together are at most a
    quarter of the memory available; True, always; False, never). ``threads=None``
    shares this machine's cores among the ranks of the node. Saving into a directory first
    withdraws its ``.metadata``, so a save that fails part-way never leaves a checkpoint that
    looks complete. ``path`` (and ``base``) may be URLs, opened with ``storage_options``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mode: str = "lossless",
        threads: int | None = None,
        base: str | os.PathLike[str] | None = None,
        keyframe_every: int | None = None,
        overwrite: bool = True,
        cache_staged_state_dict: bool = False,
        storage_options: StorageOptions = None,
        cache_decoded: bool | None = None,
    ) -> None:
        policy_for(mode)  # an unknown mode fails here, not on every rank mid-save
        if cache_decoded is not None and not isinstance(cache_decoded, bool):
            raise ConfigError(f"cache_decoded must be True, False or None, not {cache_decoded!r}")
        self.cache_decoded = cache_decoded
        super().__init__(
            path, single_file_per_rank=True, sync_files=True, overwrite=overwrite,
            cache_staged_state_dict=cache_staged_state_dict,
        )
        self.storage_options = storage_options
        _on_store(self, path, storage_options)
        self.mode = mode
        self.threads = rank_threads() if threads is None else resolve_threads(threads)
        self.base = None if base is None else os.fspath(base)
        if self.base is not None and same_file(self.base, path):
            raise ConfigError(f"{os.fspath(path)}: a checkpoint cannot be its own base (saving "
                              f"into it withdraws its {METADATA_FILE} first); pass the previous one")
        self.keyframe_every = keyframe_every
        self.is_coordinator = False

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Check the target as DCP does, then withdraw an earlier commit marker there. The
        coordinator's local plan precedes every rank's writes, so from here until ``finish`` the
        directory never looks complete."""
        plan = super().prepare_local_plan(plan)
        self._check_base()  # before the target's marker goes: a refused save touches nothing
        if self.use_collectives and self.is_coordinator:
            marker = self.fs.concat_path(self.path, METADATA_FILE)
        elif not self.use_collectives and self.rank is not None:
            marker = self.fs.concat_path(self.path, f"__{self.rank}{METADATA_FILE}")
        else:
            return plan
        if self.fs.exists(marker):
            self.fs.rm_file(marker)
        return plan

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """Compress this rank's items into ``<prefix>0.ckz`` atomically (temporary name, fsync,
        rename; on S3 a multipart upload) and report where each item went."""
        file_name = f"{plan.storage_data.prefix}0{SUFFIX}"
        target = os.fspath(self.fs.concat_path(self.path, file_name))
        state: dict[str, Any] = {}
        keys: list[tuple[WriteItem, str]] = []
        for item in plan.items:
            key = item_key(item.index)
            if key in state:
                raise Error(f"{target}: two DCP items share the storage key {key!r}; rename one")
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                assert isinstance(data, io.BytesIO)  # DCP resolves BYTE_IO items to BytesIO
                state[key] = data.getvalue()
            else:
                assert isinstance(data, torch.Tensor)
                state[key] = data.detach()
            keys.append((item, key))
        run = (_normalized(os.path.dirname(_normalized(self.path))), file_name)
        with _HELD_LOCK:
            pending = _HELD.pop(run, None)  # consumed: a failure holds nothing
        held = settle(pending)
        base = self._base_file(file_name)
        if base is not None and held is not None and self.cache_decoded is not False:
            opened: Any = open_held_base(base, held, threads=self.threads,
                                         storage_options=self.storage_options)
        else:
            opened = base
        report = save(state, target, mode=self.mode, base=opened,
                      threads=self.threads, metadata={"dcp": {"rank": self.rank}},
                      keyframe_every=self.keyframe_every, storage_options=self.storage_options)
        leaves = flatten(state)[1]
        # every rank of the node holds its own: their sum must fit
        if worth_holding(sum(leaf.nbytes for leaf in leaves) * local_ranks(), self.cache_decoded,
                         os.fspath(self.path)):
            # the given tensors copied (DCP may hand them back to training, or reuse its staging
            # buffers), the lossy ones decoded in the background while training goes on
            pending = hold_written_soon(target, {leaf.name: leaf for leaf in leaves}, held,
                                        threads=self.threads, storage_options=self.storage_options)
            with _HELD_LOCK:
                _HELD[run] = pending
        del state, leaves
        # the state is a flat dict, so each item's key is its path's name
        where = RankFile(file_name, report.id)
        results = [
            WriteResult(index=item.index, size_in_bytes=report.stored_bytes_at[key], storage_data=where)
            for item, key in keys
        ]
        future: Future[list[WriteResult]] = Future()
        future.set_result(results)
        return future

    def _check_base(self) -> None:
        """The base, if any, is another checkpoint, and a committed one."""
        if self.base is None:
            return
        if same_file(self.base, self.path):
            raise ConfigError(f"{self.path}: a checkpoint cannot be its own base; pass the previous one")
        if not _committed(self.base, self.rank, self.storage_options):
            raise BaseMismatchError(
                f"base {self.base}: no {METADATA_FILE}, so it is not a complete DCP checkpoint "
                f"(rank {self.rank}); pass a checkpoint that finished saving"
            )

    def _base_file(self, file_name: str) -> str | None:
        """This rank's file in the base checkpoint, if it has one (ranks added since start
        standalone); :meth:`prepare_local_plan` checked the base before any write."""
        if self.base is None:
            return None
        path = os.path.join(self.base, file_name)
        return path if exists(path, self.storage_options) else None

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Write DCP's ``.metadata`` (the commit), after checking every item is in a ckz file."""
        for rank_results in results:
            for result in rank_results:
                if not isinstance(result.storage_data, RankFile):
                    raise Error(f"{self.path}: item {result.index.fqn!r} was not written by ckptzip")
        super().finish(metadata, results)


class CompressedReader(FileSystemReader):
    """A DCP ``StorageReader`` for checkpoints written by :class:`CompressedWriter`.

    Each read request is served from the rank file that holds its stored shard, narrowed to the
    requested region, so loading reshards to any world size. ``threads=None`` shares this
    machine's cores among the ranks of the node. ``path`` may be a URL, opened with
    ``storage_options``; each rank fetches only the chunks of the shards it needs.
    """

    def __init__(self, path: str | os.PathLike[str], *, threads: int | None = None,
                 storage_options: StorageOptions = None) -> None:
        super().__init__(path)
        self.storage_options = storage_options
        _on_store(self, path, storage_options)
        self.threads = rank_threads() if threads is None else resolve_threads(threads)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any,
                              **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        for index, where in self.storage_data.items():
            if not isinstance(where, RankFile):
                raise FormatError(
                    f"{self.path}: item {index.fqn!r} is not stored by ckptzip.dcp.CompressedWriter; "
                    f"load this checkpoint with torch.distributed.checkpoint.FileSystemReader"
                )

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[RankFile, list[ReadItem]] = {}
        for request in plan.items:
            per_file.setdefault(self.storage_data[request.storage_index], []).append(request)
        for where, requests in per_file.items():
            path = os.fspath(self.fs.concat_path(self.path, where.relative_path))
            with CheckpointFile.open(path, threads=self.threads,
                                     storage_options=self.storage_options) as checkpoint:
                self._read_file(checkpoint, where, requests, planner)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def _read_file(self, checkpoint: CheckpointFile, where: RankFile, requests: list[ReadItem],
                   planner: LoadPlanner) -> None:
        """Check that the file is the one ``.metadata`` names, then decode the stored items the
        requests need, a batch at a time, and hand DCP each request's region."""
        name = checkpoint.name
        if checkpoint.id != where.file_id:
            raise FormatError(
                f"{name}: content id {checkpoint.id}, but {self.path}/{METADATA_FILE} expects "
                f"{where.file_id}: the file is from another save; restore the directory as one piece"
            )
        nodes = flat_items(checkpoint.header.tree)
        if nodes is None:
            raise FormatError(f"{name}: not a DCP rank file (its state is not a flat dict of items)")
        for batch in _batches(checkpoint, nodes, requests):
            wanted = {key: nodes[key] for _, key in batch}
            decoded = checkpoint.read_leaves(sorted({_item_leaf(node) for node in wanted.values()}))
            values = unflatten(flat_tree(wanted), decoded.__getitem__, len(checkpoint.leaves), name)
            for request, key in batch:
                _serve(name, key, request, values[key], planner)


def _normalized(path: str | os.PathLike[str]) -> str:
    text = os.fspath(path)
    return text.rstrip("/") if is_url(text) else os.path.abspath(text)


def _batches(checkpoint: CheckpointFile, nodes: dict[str, Any], requests: list[ReadItem]
             ) -> Iterator[list[tuple[ReadItem, str]]]:
    """Requests with their item keys, in groups whose stored items add up to about
    READ_BATCH_BYTES."""
    batch: list[tuple[ReadItem, str]] = []
    size = 0
    for request in requests:
        key = item_key(request.storage_index)
        index = leaf_index(nodes.get(key))
        if index is None or not 0 <= index < len(checkpoint.leaves):
            raise FormatError(f"{checkpoint.name}: item {key!r} is missing; the file is damaged")
        batch.append((request, key))
        size += checkpoint.leaves[index].nbytes
        if size >= READ_BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _item_leaf(node: Any) -> int:
    """The leaf of an item node :func:`_batches` has checked."""
    index = leaf_index(node)
    assert index is not None
    return index


def _serve(name: str, key: str, request: ReadItem, value: Any, planner: LoadPlanner) -> None:
    """Give DCP the region ``request`` wants of the stored item ``value``."""
    if request.type == LoadItemType.BYTE_IO:
        if not isinstance(value, bytes):
            raise FormatError(f"{name}: item {key!r} should hold bytes; the file is damaged")
        planner.load_bytes(request, io.BytesIO(value))
        return
    if not isinstance(value, torch.Tensor):
        raise FormatError(f"{name}: item {key!r} should hold a tensor; the file is damaged")
    region = narrow_tensor_by_index(value, request.storage_offsets, request.lengths)
    target = planner.resolve_tensor(request).detach()
    if target.size() != region.size():
        raise FormatError(
            f"{name}: item {key!r} gives a region of {list(region.size())} where DCP expects "
            f"{list(target.size())}; the checkpoint does not match its .metadata"
        )
    target.copy_(region)
    planner.commit_tensor(request, target)
