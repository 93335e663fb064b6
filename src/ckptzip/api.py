"""The public API: save/load to paths or fsspec URLs, dumps/loads in memory, open for lazy reads."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .chain import relative_location, same_file
from .errors import ConfigError
from .objstore import StorageOptions
from .parallel import gc_paused
from .planning import Prepared
from .reader import CheckpointFile, open_base, refuse_writing_over_chain
from .sinks import MemorySink, open_sink
from .storage import BytesSource, PathLike
from .writer import SaveReport, encode_state


def save(
    state: Any,
    path: PathLike,
    *,
    mode: str = "lossless",
    base: Any = None,
    threads: int | None = None,
    metadata: dict[str, Any] | None = None,
    keyframe_every: int | None = None,
    progress: bool = False,
    resumed: bool = False,
    storage_options: StorageOptions = None,
    **mode_options: Any,
) -> SaveReport:
    """Compress ``state`` (any nesting of dicts, lists and tuples of tensors, arrays, numbers,
    strings, bytes and None) to ``path`` atomically, and report what it gained.

    ``base`` (an earlier ``.ckz``) makes an incremental checkpoint: each tensor is coded against
    the base's tensor of the same name where that is smaller, still bit-exact. Loading it needs
    the base, which is looked up beside it. ``keyframe_every=K`` bounds chains: when the base
    already heads a chain of K-1 deltas, this checkpoint is written standalone instead (and
    at 64 files a chain, whatever K: ``planning.MAX_CHAIN``).
    ``threads=None`` uses every core. ``metadata`` is a JSON-able dict stored in the header.
    ``storage_options`` go to the fsspec filesystem of a URL ``path`` (and of a URL ``base``):
    ``{"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}`` for S3, where the
    save streams as a multipart upload that becomes the object only once complete.
    Other keyword arguments are options of the mode (``chunk_bytes``, 4 KiB to 64 MiB, for every
    mode).
    The report's seconds cover the whole save, the upload or the fsync and rename included.

    ``resumed=True`` says that the training which made ``state`` went on from ``base`` *as
    loaded* (it resumed from the decoded checkpoint), not from the true state the base was saved
    from. Lossy modes then know that the difference from the base is all training's update. The
    default, False, is the safe answer when unsure: it can only make a lossy checkpoint larger
    than needed, never its error grow along a chain. :class:`ckptzip.CheckpointManager` passes
    it for you (it knows when ``restore()`` ran).
    """
    started = time.perf_counter()
    target = os.fspath(path)
    if isinstance(state, Prepared):  # planned by ckptzip.planning.prepare, which opened its base
        if base is not None:
            raise ConfigError("a prepared state carries its base: pass base= to prepare(), not save()")
        opened = state.base
    else:
        if isinstance(base, (str, os.PathLike)):
            _refuse_own_base(target, os.fspath(base))  # before the base is even opened
        opened = open_base(base, threads=threads, storage_options=storage_options)
    location = None
    try:
        if isinstance(base, (str, os.PathLike)):
            location = relative_location(os.fspath(base), target)
        elif opened is not None and opened.location is not None and not opened.location.startswith("<"):
            _refuse_own_base(target, opened.location)  # an open checkpoint, a prepared state's base
            location = relative_location(opened.location, target)
        refuse_writing_over_chain(target, opened)
        with open_sink(target, storage_options) as sink:
            report = encode_state(
                state, sink, mode=mode, threads=threads, metadata=metadata,
                path=target, progress=progress, base=opened, base_location=location,
                keyframe_every=keyframe_every, mode_options=mode_options, resumed=resumed,
            )
    finally:
        if opened is not None:
            opened.close()
    report.seconds = time.perf_counter() - started
    return report


def _refuse_own_base(target: str, base: str) -> None:
    """A delta saved over its own base would replace the base and name itself as its base:
    both checkpoints lost, and the save would succeed. Refused before anything is written."""
    if same_file(target, base):
        also = "" if target == base else f" ({base})"
        raise ConfigError(
            f"{target}: is the base{also} this delta is coded against; saving over it would "
            f"replace the base and leave a delta that names itself as its base, both lost. "
            f"Save the delta to a new path (the next step's file) with base={base!r}")


def load(
    path: PathLike,
    *,
    map_location: Any = "cpu",
    base: Any = None,
    threads: int | None = None,
    progress: bool = False,
    storage_options: StorageOptions = None,
) -> Any:
    """Read a ``.ckz`` back into the state it was saved from (bit-exact for lossless mode).

    A delta finds its base (and the base's own base) beside it; ``base=`` overrides that with a
    path, an open checkpoint, or the in-memory state it was coded against. From a URL, chunks
    are fetched by ranged requests, ``2 * threads`` at most outstanding, while they decode;
    ``storage_options`` go to its fsspec filesystem.
    """
    return _load_all(lambda: CheckpointFile.open(path, threads=threads, base=base,
                                                 storage_options=storage_options),
                     map_location, progress)


def dumps(
    state: Any,
    *,
    mode: str = "lossless",
    base: Any = None,
    threads: int | None = None,
    metadata: dict[str, Any] | None = None,
    keyframe_every: int | None = None,
    resumed: bool = False,
    **mode_options: Any,
) -> bytes:
    """Like :func:`save`, into bytes. ``base`` may also be the previous in-memory state (or the
    bytes of a previous ``dumps``); ``loads`` then needs the same ``base``."""
    opened = open_base(base, threads=threads)
    sink = MemorySink()
    try:
        encode_state(state, sink, mode=mode, threads=threads, metadata=metadata, base=opened,
                     keyframe_every=keyframe_every, mode_options=mode_options, resumed=resumed)
    finally:
        if opened is not None:
            opened.close()
    return sink.result


def loads(
    data: bytes | bytearray | memoryview,
    *,
    map_location: Any = "cpu",
    base: Any = None,
    threads: int | None = None,
) -> Any:
    """Like :func:`load`, from bytes."""
    return _load_all(lambda: CheckpointFile(BytesSource(data), threads=threads, base=base),
                     map_location, False)


def _load_all(opener: Callable[[], CheckpointFile], map_location: Any, progress: bool) -> Any:
    """Open, load everything, close; with the collector paused, and the checkpoint's header
    objects (hundreds of small containers) freed *before* it resumes. Still alive then, a load's
    temporaries would be moved to the older generations by the collection the resumption sets
    off, and every few dozen loads they would set off a full collection of the whole process:
    measured 13% of a one-thread loads() of a bf16 GPT state dict."""
    with gc_paused():
        checkpoint = opener()
        try:
            state = checkpoint.load(map_location=map_location, progress=progress)
        finally:
            checkpoint.close()
        del checkpoint
        return state


def open(path: PathLike, *, threads: int | None = None, base: Any = None,
         storage_options: StorageOptions = None) -> CheckpointFile:
    """Open a ``.ckz`` lazily: ``keys()``, ``get_tensor(key)``, ``metadata``, ``load()``. From a
    URL, ``get_tensor`` fetches only the header and that tensor's chunks.

    Use it as a context manager so the file is closed::

        with ckptzip.open("step-100.ckz") as ckpt:
            w = ckpt.get_tensor("model.lm_head.weight")
    """
    return CheckpointFile.open(path, threads=threads, base=base, storage_options=storage_options)
