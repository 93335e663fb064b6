"""The public API: save/load to paths or fsspec URLs, dumps/loads in memory, open for lazy reads."""

from __future__ import annotations

import os
from typing import Any

from .errors import ConfigError
from .reader import CheckpointFile
from .storage import BytesSource, PathLike, atomic_write
from .writer import FileSink, MemorySink, SaveReport, encode_state


def _check_base(base: Any) -> None:
    if base is not None:
        raise ConfigError(
            "base=: this ckptzip writes and reads standalone checkpoints only; pass base=None"
        )


def save(
    state: Any,
    path: PathLike,
    *,
    mode: str = "lossless",
    base: Any = None,
    threads: int | None = None,
    metadata: dict[str, Any] | None = None,
    progress: bool = False,
) -> SaveReport:
    """Compress ``state`` (any nesting of dicts, lists and tuples of tensors, arrays, numbers,
    strings, bytes and None) to ``path`` atomically, and report what it gained.

    ``threads=None`` uses every core. ``metadata`` is a JSON-able dict stored in the header.
    """
    _check_base(base)
    target = os.fspath(path)
    with atomic_write(target) as handle:
        report = encode_state(
            state, FileSink(handle), mode=mode, threads=threads, metadata=metadata,
            path=target, progress=progress,
        )
    return report


def load(
    path: PathLike,
    *,
    map_location: Any = "cpu",
    base: Any = None,
    threads: int | None = None,
    progress: bool = False,
) -> Any:
    """Read a ``.ckz`` back into the state it was saved from (bit-exact for lossless mode)."""
    _check_base(base)
    with CheckpointFile.open(path, threads=threads) as checkpoint:
        return checkpoint.load(map_location=map_location, progress=progress)


def dumps(
    state: Any,
    *,
    mode: str = "lossless",
    base: Any = None,
    threads: int | None = None,
    metadata: dict[str, Any] | None = None,
) -> bytes:
    """Like :func:`save`, into bytes."""
    _check_base(base)
    sink = MemorySink()
    encode_state(state, sink, mode=mode, threads=threads, metadata=metadata)
    return sink.result


def loads(
    data: bytes | bytearray | memoryview,
    *,
    map_location: Any = "cpu",
    base: Any = None,
    threads: int | None = None,
) -> Any:
    """Like :func:`load`, from bytes."""
    _check_base(base)
    with CheckpointFile(BytesSource(data), threads=threads) as checkpoint:
        return checkpoint.load(map_location=map_location)


def open(path: PathLike, *, threads: int | None = None) -> CheckpointFile:
    """Open a ``.ckz`` lazily: ``keys()``, ``get_tensor(key)``, ``metadata``, ``load()``.

    Use it as a context manager so the file is closed::

        with ckptzip.open("step-100.ckz") as ckpt:
            w = ckpt.get_tensor("model.lm_head.weight")
    """
    return CheckpointFile.open(path, threads=threads)
