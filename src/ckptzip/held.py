"""The newest checkpoint as decoded, held in host memory, so the next delta decodes nothing.

A delta is coded against what its base *decodes to*, and a base that is itself a delta decodes
through its whole chain, link by link: a save at chain depth ``d`` decodes ``d`` files before it
codes anything (an adaptive delta of the HF benchmark's MiniLM took 1.35 s at depth 1 and 3.05 s
at depth 7). A writer that saves checkpoint after checkpoint already knows most of what the newest
one decodes to: a tensor stored without whole-tensor transforms decodes to the very bytes it was
given (checked here against its chunks' CRC-32Cs before they are trusted), and the lossy ones
decode in one pass against the checkpoint held before. :func:`hold_written` builds that,
:func:`open_held_base` hands it to the next save as its base's decoded tensors; the files written
are the same bytes either way (the tests compare them). The cost is host memory: one state's raw
bytes held between saves.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np

from .chain import Base
from .container import Header, LeafInfo
from .errors import Error
from .objstore import StorageOptions
from .parallel import background_executor
from .reader import CheckpointFile, open_base
from .storage import PathLike
from .tree import Leaf, flatten, tensor_bytes

log = logging.getLogger("ckptzip")


@dataclass
class HeldCheckpoint:
    """What the checkpoint at ``location``, content id ``id``, decodes to: each stored tensor's raw
    bytes (uint8, C order) by leaf name."""

    location: str
    id: str
    tensors: dict[str, np.ndarray]
    #: The file's parsed header, kept so that the next open of the file (a manager's check of
    #: its chain, the next delta's base) finds it parsed (``container.parsed_header``).
    header: Header | None = None

    @property
    def nbytes(self) -> int:
        return sum(data.nbytes for data in self.tensors.values())


def open_held_base(location: PathLike, held: HeldCheckpoint | None, *, threads: int | None = None,
                   storage_options: StorageOptions = None, consume: bool = False) -> Base:
    """The checkpoint at ``location`` as a delta's base, its tensors' decoded bytes taken from
    ``held`` where ``held`` is that checkpoint (the same content id; otherwise they are decoded
    from the file as usual). The base's header records (each tensor's pipeline and error record)
    are the file's. ``consume=True`` hands ``held``'s tensors over (``held`` is emptied): the base
    then frees each once its reader is done with it, instead of holding all of them to the end."""
    base = open_base(os.fspath(location), threads=threads, storage_options=storage_options)
    assert base is not None  # a path always opens a base (or raises)
    if held is not None and held.id == base.id:
        for name, data in held.tensors.items():
            if base.tensor(name) is not None:
                base.cache(name, data)
        if consume:
            held.tensors.clear()
    return base


def hold_written(location: str, given: dict[str, Leaf], previous: HeldCheckpoint | None, *,
                 copy: bool, threads: int | None = None,
                 storage_options: StorageOptions = None) -> HeldCheckpoint:
    """What the checkpoint just written at ``location`` decodes to.

    ``given``: the leaves of the state as saved, by name. A tensor the file stores without
    whole-tensor transforms, whose chunks' CRC-32Cs its bytes match, is held as those bytes
    (copied when ``copy``: the caller's state may change after the save; a snapshot need not be);
    every other tensor is decoded from the file, against ``previous`` where that is its base
    (``previous`` is consumed, its tensors freed as they serve), else through its chain."""
    taken = _take_given(location, given, copy=copy, threads=threads,
                        storage_options=storage_options)
    return _decode_rest(taken, previous, threads=threads, storage_options=storage_options)


class PendingHold:
    """:func:`hold_written` whose decode of the lossy tensors runs on a thread of its own
    (:func:`hold_written_soon`); :func:`settle` waits for it."""

    def __init__(self, future: Future[HeldCheckpoint], location: str) -> None:
        self.future = future
        self.location = location

    def result(self) -> HeldCheckpoint | None:
        """The held checkpoint, once decoded; None where the decode failed (logged: the next
        delta then decodes its base chain, as without a held checkpoint)."""
        try:
            return self.future.result()
        except Exception as error:  # holding is an optimisation: never fatal
            log.warning("%s: not holding this checkpoint as decoded (%s); the next delta decodes "
                        "its base chain instead", self.location, error)
            return None


def hold_written_soon(location: str, given: dict[str, Leaf], previous: HeldCheckpoint | None, *,
                      threads: int | None = None,
                      storage_options: StorageOptions = None) -> HeldCheckpoint | PendingHold:
    """:func:`hold_written` for a writer that saves on the training thread (the Hugging Face
    Trainer's, DCP's): the given tensors' bytes are copied now, as the caller's state changes
    once this returns, and the decode of the lossy ones (a third of an adaptive save's time)
    runs on a background thread while training goes on. :func:`settle` the result before the
    next save uses it."""
    taken = _take_given(location, given, copy=True, threads=threads,
                        storage_options=storage_options)
    if not taken.decode:
        return HeldCheckpoint(location, taken.file_id, taken.tensors, taken.header)
    # one thread decodes the pending holds, one at a time
    future = background_executor("ckptzip-hold").submit(_decode_rest, taken, previous,
                                                        threads=threads,
                                                        storage_options=storage_options)
    return PendingHold(future, location)


def settle(held: HeldCheckpoint | PendingHold | None) -> HeldCheckpoint | None:
    """``held`` as a checkpoint, waiting for a pending decode to finish (None if it failed)."""
    return held.result() if isinstance(held, PendingHold) else held


@dataclass
class _Taken:
    """A written checkpoint's tensors held from the given bytes, and those left to decode."""

    location: str
    header: Header
    tensors: dict[str, np.ndarray]
    decode: list[int]

    @property
    def file_id(self) -> str:
        return self.header.id

    @property
    def base_id(self) -> str | None:
        base = self.header.base
        return None if base is None else base.id

    @property
    def leaves(self) -> tuple[LeafInfo, ...]:
        return self.header.leaves


def _take_given(location: str, given: dict[str, Leaf], *, copy: bool, threads: int | None,
                storage_options: StorageOptions) -> _Taken:
    tensors: dict[str, np.ndarray] = {}
    decode: list[int] = []
    with CheckpointFile.open(location, threads=threads, storage_options=storage_options) as written:
        header = written.header
        for leaf in header.leaves:
            given_leaf = given.get(leaf.name)
            data = None if given_leaf is None else _exact_bytes(leaf, given_leaf)
            if given_leaf is None or data is None:
                decode.append(leaf.index)
            else:  # a host tensor's bytes are a view of it; another device's, a copy already
                on_host = given_leaf.tensor.device.type == "cpu"
                tensors[leaf.name] = data.copy() if copy and on_host else data
    return _Taken(location, header, tensors, decode)


def _decode_rest(taken: _Taken, previous: HeldCheckpoint | None, *, threads: int | None,
                 storage_options: StorageOptions) -> HeldCheckpoint:
    """``taken`` completed: its tensors left to decode, decoded from its file, against
    ``previous`` where that is its base (consumed)."""
    tensors, location = taken.tensors, taken.location
    if taken.decode:
        base = None
        if previous is not None and taken.base_id is not None and taken.base_id == previous.id:
            base = open_held_base(previous.location, previous, threads=threads,
                                  storage_options=storage_options, consume=True)
        try:
            with CheckpointFile.open(location, threads=threads, base=base,
                                     storage_options=storage_options) as written:
                if written.id != taken.file_id:
                    raise Error(f"{location}: the checkpoint changed while it was read back "
                                f"(content id {taken.file_id}, then {written.id}): is another "
                                f"process writing this directory?")
                for index, tensor in written.read_leaves(taken.decode).items():
                    tensors[taken.leaves[index].name] = tensor_bytes(tensor)
        finally:
            if base is not None:
                base.close()
    return HeldCheckpoint(location, taken.file_id, tensors, taken.header)


def hold_loaded(location: str, state: Any, *, storage_options: StorageOptions = None
                ) -> HeldCheckpoint:
    """The checkpoint at ``location`` as held, from ``state``, what loading it just gave: each
    stored tensor's values copied (training changes them in place). A tensor the file holds that
    the state does not show (a transform's sibling array) is decoded from the file when a base
    asks for it."""
    leaves = {leaf.name: leaf for leaf in flatten(state)[1]}
    tensors: dict[str, np.ndarray] = {}
    with CheckpointFile.open(location, storage_options=storage_options) as checkpoint:
        file_id, header = checkpoint.id, checkpoint.header
        for info in checkpoint.leaves:
            leaf = leaves.get(info.name)
            if leaf is not None and leaf.dtype == info.dtype and leaf.shape == info.shape:
                data = leaf.host_bytes()
                tensors[info.name] = data.copy() if leaf.tensor.device.type == "cpu" else data
    return HeldCheckpoint(location, file_id, tensors, header)


def _exact_bytes(leaf: LeafInfo, given: Leaf) -> np.ndarray | None:
    """``given``'s raw bytes where the file stores them exactly: no whole-tensor transforms (the
    tensor decodes to its chunks' raw bytes) and every chunk's CRC-32C is theirs; else None."""
    if leaf.pipeline.transforms or given.dtype != leaf.dtype or given.shape != leaf.shape:
        return None
    data = given.host_bytes()
    return data if leaf.holds_raw(data) else None


def worth_holding(size: int, setting: bool | None, where: str) -> bool:
    """Whether to hold a checkpoint of a state of ``size`` raw bytes as decoded: ``setting``
    True or False says; None (the default) holds it while it is at most a quarter of the host
    memory available now, and logs why not otherwise (``where``: whose checkpoints)."""
    if setting is not None:
        return setting
    available = available_memory()
    if available is not None and size > available // 4:
        log.info("%s: not holding the newest checkpoint as decoded: the state (%d MB) is over a "
                 "quarter of the host memory available (%d MB); each delta decodes its base "
                 "chain instead (cache_decoded=True holds it anyway)",
                 where, size >> 20, available >> 20)
        return False
    return True


def available_memory() -> int | None:
    """Bytes of host memory available to a new allocation without swapping (Linux's
    MemAvailable; elsewhere the free pages), or None where the host does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
