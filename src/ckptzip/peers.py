"""The compressors users already know, behind one small interface, for benchmarks.

A peer compresses the raw bytes of one tensor, given as a numpy array. Types numpy lacks (bf16,
fp8) arrive as an unsigned-integer view of the same bytes, so the true element type travels
separately as ``dtype``, a torch dtype name (``"bfloat16"``); peers that ignore element types use
only ``array.itemsize``. Every peer is lossless: ``decompress(compress(a), a)`` equals ``a`` bit for
bit. The peers are:

- ``zstd-1``, ``zstd-3``: plain zstd on the raw bytes (``zstandard``).
- ``zstd-1+planes``: byte planes (byte ``p`` of every element to stream ``p``), then zstd-1 per
  plane: the classic byte-grouping baseline, without zipnn's bit rotation.
- ``blosc2``: blosc2's byte shuffle (typesize = element size) + zstd level 1.
- ``zipnn``: zipnn 0.5.4 (bit rotation + byte grouping + Huffman per 256 KB chunk). It codes only
  float32/bfloat16/float16; other element types are stored raw, as its safetensors plugin leaves
  them uncompressed.
"""

from __future__ import annotations

import importlib
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from importlib import metadata
from types import ModuleType
from typing import Any, ClassVar

import numpy as np

from .errors import ConfigError, DependencyError

#: blosc2 refuses buffers of 2 GB or more; larger tensors go in parts of this size.
_BLOSC2_PART = 1 << 30
_ZIPNN_DTYPES = ("float32", "bfloat16", "float16")


def _pack(parts: Sequence[bytes]) -> bytes:
    """Frame ``parts`` as: count (u32), each length (u64), then the parts back to back."""
    head = struct.pack(f"<I{len(parts)}Q", len(parts), *(len(p) for p in parts))
    return b"".join([head, *parts])


def _unpack(blob: bytes) -> list[memoryview]:
    """Inverse of :func:`_pack`."""
    (count,) = struct.unpack_from("<I", blob)
    lengths = struct.unpack_from(f"<{count}Q", blob, 4)
    view = memoryview(blob)
    offset = 4 + 8 * count
    parts = []
    for length in lengths:
        parts.append(view[offset : offset + length])
        offset += length
    return parts


def _like(raw: bytes | bytearray | memoryview, like: np.ndarray) -> np.ndarray:
    """``raw`` viewed as an array with ``like``'s dtype and shape (no copy)."""
    return np.frombuffer(raw, dtype=like.dtype).reshape(like.shape)


def _bytes(array: np.ndarray) -> np.ndarray:
    """The raw bytes of ``array`` in C order, as flat uint8 (no copy when it is contiguous)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class Peer(ABC):
    """One compressor, measured on the raw bytes of one tensor at a time."""

    name: str
    #: The pip distribution that provides it, also its import name.
    package: ClassVar[str]

    def available(self) -> bool:
        """True if the package imports."""
        try:
            self._module()
        except DependencyError:
            return False
        return True

    def unavailable_reason(self) -> str | None:
        """Why the peer cannot run here, or None when it can."""
        try:
            self._module()
        except DependencyError as exc:
            return str(exc)
        return None

    def version(self) -> str:
        """The installed package's version (``"missing"`` when not installed)."""
        try:
            return metadata.version(self.package)
        except metadata.PackageNotFoundError:
            return "missing"

    def _module(self) -> ModuleType:
        try:
            return importlib.import_module(self.package)
        except ImportError as exc:
            raise DependencyError(
                f"peer {self.name!r} needs {self.package}: pip install {self.package} ({exc})"
            ) from exc

    @abstractmethod
    def compress(
        self, array: np.ndarray, *, threads: int, dtype: str | None = None, scratch: bool = False
    ) -> bytes:
        """Compress ``array``'s raw bytes.

        ``dtype`` is the element type's torch name when ``array`` is only a view of it (bf16 as
        uint16); it defaults to ``array.dtype.name``. ``scratch=True`` says the caller no longer
        needs ``array``'s contents, so a peer that works in place may overwrite them instead of
        copying first.
        """

    @abstractmethod
    def decompress(
        self, blob: bytes, like: np.ndarray, *, threads: int, dtype: str | None = None
    ) -> np.ndarray:
        """Restore the array ``blob`` was compressed from: ``like`` gives numpy dtype and shape,
        ``dtype`` the element type as given to :meth:`compress`. The result may be read-only."""


class Zstd(Peer):
    """Plain zstd on the raw bytes; ``threads`` goes to zstd's own compression workers."""

    package = "zstandard"

    def __init__(self, level: int) -> None:
        self.level = level
        self.name = f"zstd-{level}"

    def _compressor(self, threads: int) -> Any:
        # zstd's threads=1 would add one asynchronous worker; 0 compresses in the calling thread.
        return self._module().ZstdCompressor(
            level=self.level, threads=threads if threads > 1 else 0
        )

    def _decompress(self, blob: bytes | memoryview, size: int) -> bytes:
        if not size:
            return b""
        return self._module().ZstdDecompressor().decompress(blob, max_output_size=size)

    def compress(
        self, array: np.ndarray, *, threads: int, dtype: str | None = None, scratch: bool = False
    ) -> bytes:
        return self._compressor(threads).compress(_bytes(array))

    def decompress(
        self, blob: bytes, like: np.ndarray, *, threads: int, dtype: str | None = None
    ) -> np.ndarray:
        return _like(self._decompress(blob, like.nbytes), like)


class ZstdPlanes(Zstd):
    """Byte planes (a transpose of the element bytes), then zstd per plane."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.name = f"zstd-{level}+planes"

    def compress(
        self, array: np.ndarray, *, threads: int, dtype: str | None = None, scratch: bool = False
    ) -> bytes:
        planes = _bytes(array).reshape(-1, array.itemsize).T
        compressor = self._compressor(threads)
        return _pack([compressor.compress(np.ascontiguousarray(plane)) for plane in planes])

    def decompress(
        self, blob: bytes, like: np.ndarray, *, threads: int, dtype: str | None = None
    ) -> np.ndarray:
        planes = [
            np.frombuffer(self._decompress(part, like.size), np.uint8) for part in _unpack(blob)
        ]
        return _like(np.stack(planes, axis=1).data, like)


class Blosc2(Peer):
    """blosc2: byte shuffle with typesize = element size, then zstd level 1, ``nthreads``."""

    name = "blosc2"
    package = "blosc2"

    def compress(
        self, array: np.ndarray, *, threads: int, dtype: str | None = None, scratch: bool = False
    ) -> bytes:
        blosc2 = self._module()
        raw = _bytes(array)
        params = blosc2.CParams(
            codec=blosc2.Codec.ZSTD,
            clevel=1,
            typesize=array.itemsize,
            nthreads=threads,
            filters=[blosc2.Filter.SHUFFLE],
            filters_meta=[0],
        )
        parts = [
            blosc2.compress2(raw[i : i + _BLOSC2_PART], cparams=params)
            for i in range(0, raw.size, _BLOSC2_PART)
        ]
        return _pack(parts)

    def decompress(
        self, blob: bytes, like: np.ndarray, *, threads: int, dtype: str | None = None
    ) -> np.ndarray:
        blosc2 = self._module()
        params = blosc2.DParams(nthreads=threads)
        parts = [blosc2.decompress2(part, dparams=params) for part in _unpack(blob)]
        return _like(parts[0] if len(parts) == 1 else b"".join(parts), like)


class ZipNN(Peer):
    """zipnn 0.5.4 on bytes, ``bytearray_dtype`` = the element type, ``threads`` workers.

    zipnn rewrites its byte input in place, so it gets a copy unless ``scratch`` is set. Element
    types it does not code are stored raw.
    """

    name = "zipnn"
    package = "zipnn"

    def compress(
        self, array: np.ndarray, *, threads: int, dtype: str | None = None, scratch: bool = False
    ) -> bytes:
        raw = _bytes(array)
        if not _zipnn_codes(array, dtype):
            return raw.tobytes()
        buf = raw.data if scratch and raw.flags.writeable else bytearray(raw)
        coder = self._module().ZipNN(
            input_format="byte", bytearray_dtype=dtype or array.dtype.name, threads=threads
        )
        return coder.compress(buf)

    def decompress(
        self, blob: bytes, like: np.ndarray, *, threads: int, dtype: str | None = None
    ) -> np.ndarray:
        if not _zipnn_codes(like, dtype):
            return _like(blob, like)
        return _like(
            self._module().ZipNN(input_format="byte", threads=threads).decompress(blob), like
        )


def _zipnn_codes(array: np.ndarray, dtype: str | None) -> bool:
    """Whether zipnn codes this array itself (it only knows floats), rather than storing it raw."""
    return array.size > 0 and (dtype or array.dtype.name) in _ZIPNN_DTYPES


PEERS: dict[str, Peer] = {
    peer.name: peer for peer in (Zstd(1), Zstd(3), ZstdPlanes(1), Blosc2(), ZipNN())
}


def get(name: str) -> Peer:
    """The peer called ``name``; :class:`ConfigError` listing the known names otherwise."""
    try:
        return PEERS[name]
    except KeyError:
        raise ConfigError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}") from None
