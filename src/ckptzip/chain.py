"""Bases of incremental checkpoints: where a delta's base comes from, and how it is checked.

A delta checkpoint codes some tensors as residuals against the same-named tensors of a base: an
earlier ``.ckz`` (named in the header by relative path and content id, so it is found beside the
delta and checked), or, in memory, a state passed to ``dumps``/``loads``. Every delta tensor also
records the CRC-32C of the base tensor it was coded against, so a substituted or damaged base is
caught even where no id is known.
"""

from __future__ import annotations

import math
import os
import posixpath
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from . import _native
from .dtypes import DType
from .errors import BaseMismatchError
from .storage import PathLike, is_url, local_path
from .tree import flatten

if TYPE_CHECKING:
    from .container import LeafInfo

#: The most leading bytes of a decoded base tensor that :meth:`Base.head_differs` compares.
HEAD_CHECK_BYTES = 1 << 20


@dataclass(frozen=True)
class BaseTensor:
    name: str
    dtype: DType
    shape: tuple[int, ...]


class Base(ABC):
    """Tensors a delta is coded against, by name."""

    #: The base file's content id, or None for an in-memory state.
    id: str | None = None
    #: How many deltas lie between the base and its keyframe (0: the base is a keyframe).
    depth: int = 0
    #: Where the base file is, for the delta's header (None in memory).
    location: str | None = None

    def __init__(self) -> None:
        self._cache: dict[str, np.ndarray] = {}

    @abstractmethod
    def tensor(self, name: str) -> BaseTensor | None: ...

    @abstractmethod
    def _load(self, name: str) -> np.ndarray: ...

    def prefetch(self, names: list[str]) -> None:
        """Have the raw bytes of these base tensors at hand before :meth:`raw` asks for them one
        by one (a file decodes them in one parallel pass)."""

    def cache(self, name: str, data: np.ndarray) -> None:
        """Take ``data`` as the raw bytes of ``name`` (uint8, C order), decoded elsewhere: a
        caller that holds what this base decodes to (it just loaded it) spares the decode."""
        found = self.tensor(name)
        if found is None or data.dtype != np.uint8 or data.ndim != 1 or (
                data.size != found.dtype.itemsize * math.prod(found.shape)):
            raise BaseMismatchError(
                f"base {self.location or '<memory>'}: {name}: "
                + ("it holds no such tensor" if found is None else
                   f"{data.size} bytes given as its decoded bytes, for {found.dtype.name} "
                   f"{list(found.shape)}") + ": pass the raw bytes (uint8, 1-D) of the tensor "
                "this base decodes to")
        self._cache[name] = data

    def raw(self, name: str) -> np.ndarray:
        """The base tensor's raw bytes (uint8, C order); decoded once, then cached."""
        if name not in self._cache:
            self._cache[name] = self._load(name)
        return self._cache[name]

    def value(self, name: str) -> torch.Tensor:
        """The base tensor itself (its dtype and shape), on the host."""
        found = self.tensor(name)
        if found is None or found.dtype.torch_dtype is None:
            raise KeyError(name)
        flat = torch.from_numpy(self.raw(name)) if math.prod(found.shape) else (
            torch.empty(0, dtype=torch.uint8)  # from_numpy gives empty arrays a zero stride
        )
        return flat.view(found.dtype.torch_dtype).reshape(found.shape)

    def stored(self, name: str) -> LeafInfo | None:
        """How the base file stored ``name`` (its pipeline and header record, such as a lossy
        mode's achieved error), or None for a state in memory, which is exact."""
        return None

    def differs(self, name: str, data: np.ndarray) -> bool:
        """Whether the raw bytes ``data`` are known to differ from the base's tensor ``name``
        without decoding it; False where only the decoded bytes can tell (see
        :meth:`FileBase.differs`)."""
        return False

    def head_bytes(self, name: str) -> int:
        """How many leading raw bytes of ``name`` :meth:`head_differs` can judge without
        decoding anything (0: none). A tensor on a device is copied to the host only where its
        first bytes do not already prove a difference."""
        cached = self._cache.get(name)
        return 0 if cached is None else min(cached.size, HEAD_CHECK_BYTES)

    def head_differs(self, name: str, head: np.ndarray) -> bool:
        """Whether the raw bytes ``head`` (uint8, :meth:`head_bytes` of them) are known to differ
        from the first bytes of the base's tensor ``name``; False where they cannot tell."""
        cached = self._cache.get(name)
        return (cached is not None and head.size <= cached.size
                and not _native.bytes_equal(head, cached[:head.size]))

    def release(self, name: str) -> None:
        """Forget the cached bytes of ``name`` (a writer is done with them)."""
        self._cache.pop(name, None)

    def close(self) -> None:
        self._cache.clear()


class MemoryBase(Base):
    """A state held in memory (``dumps(state, base=previous_state)``)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self._leaves = {leaf.name: leaf for leaf in flatten(state)[1]}

    def tensor(self, name: str) -> BaseTensor | None:
        leaf = self._leaves.get(name)
        return None if leaf is None else BaseTensor(name, leaf.dtype, leaf.shape)

    def _load(self, name: str) -> np.ndarray:
        return self._leaves[name].host_bytes()


def base_exists(path: str | os.PathLike[str]) -> bool:
    if is_url(path):
        return True  # a missing remote base is reported when it is opened
    return os.path.isfile(local_path(path))  # not a FIFO or device a hostile header names: it hangs


def resolve_relative(delta: str, location: str) -> str:
    """Where a base named ``location`` in the header of ``delta`` lies (relative to the delta).

    The header is untrusted, so it may name a remote base only where the delta itself was read
    from the same place (scheme and host): a local or in-memory file must not make a load reach
    out to a server of its choosing, nor a remote one make it read local files (an absolute
    path). Such a base must be passed as ``base=`` explicitly.
    """
    if is_url(location):
        if not (is_url(delta) and _origin(delta) == _origin(location)):
            raise BaseMismatchError(
                f"{delta}: its header names a remote base, {location!r}; ckptzip fetches a base "
                f"only from where the delta itself came from: if you trust it, pass it as "
                f"base={location!r}"
            )
        return location
    if is_url(delta) and os.path.isabs(location):
        raise BaseMismatchError(
            f"{delta}: its header names a local base, {location!r}; a delta read from a URL "
            f"takes its base only from the same place: if you trust that file, pass it as "
            f"base={location!r}"
        )
    if os.path.isabs(location) or delta.startswith("<"):
        return location
    if is_url(delta):  # a key's other parts are literal: only leading ".." are steps up
        folder, rest = delta.rsplit("/", 1)[0], location
        while rest.startswith("../"):
            if not _split_url(folder)[2].strip("/"):
                raise BaseMismatchError(
                    f"{delta}: its header names its base {location!r}, above its bucket: the "
                    f"header is damaged or was crafted; pass the base as base=")
            folder, rest = folder.rsplit("/", 1)[0], rest[3:]
        return folder + "/" + rest
    return os.path.join(os.path.dirname(local_path(delta)), location)


def walk_chain(path: str, base_of: Callable[[str], str | None]) -> list[str]:
    """``path`` and the files of its base chain, nearest first, as far as ``base_of`` (the base
    a file names, resolved; None: a keyframe, or not known) knows them; a cycle ends the walk."""
    chain: list[str] = []
    current: str | None = path
    while current is not None and current not in chain:
        chain.append(current)
        current = base_of(current)
    return chain


def _split_url(url: str) -> tuple[str, str, str]:
    """``scheme://netloc/path`` as its three parts, literally: an object's key may hold ``#``
    and ``?``, which ``urllib.parse`` takes for a fragment and a query (every key under a prefix
    with a ``#`` compared as one)."""
    scheme, _, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    return scheme, netloc, slash + path


def _origin(url: str) -> tuple[str, str]:
    scheme, netloc, _ = _split_url(url)
    return scheme.lower(), netloc.lower()


def same_file(a: PathLike, b: PathLike) -> bool:
    """Whether the paths or URLs ``a`` and ``b`` name one checkpoint (or one folder): a save to
    ``a`` would replace ``b`` (a delta coded against ``b`` would then name itself). Local paths
    are compared resolved (symlinks, ``..``), or as one file where both exist and it has one link
    only (a case-insensitive filesystem, a bind mount): a hard link's other name survives the
    atomic replace, so it is not the same; URLs are compared normalised."""
    a, b = os.fspath(a), os.fspath(b)
    if is_url(a) or is_url(b):
        return is_url(a) and is_url(b) and _url_key(a) == _url_key(b)
    a, b = local_path(a), local_path(b)
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        found, other = os.stat(a), os.stat(b)
    except OSError:
        return False
    return os.path.samestat(found, other) and found.st_nlink == 1


def _url_key(url: str) -> tuple[str, str, str]:
    """A URL as compared by :func:`same_file`: the filesystem's canonical protocol (``s3a`` is
    ``s3``), the host or bucket in lower case, the path without trailing slashes (an object
    store's keys are literal otherwise: ``a//b`` and ``a/./b`` are other objects)."""
    scheme, netloc, path = _split_url(url)
    scheme = scheme.lower()
    try:
        import fsspec

        protocol = fsspec.get_filesystem_class(scheme).protocol
        scheme = protocol if isinstance(protocol, str) else protocol[0]
    except (ImportError, ValueError):
        pass  # a protocol fsspec does not know (or whose package is missing): as written
    return scheme, netloc.lower(), path.rstrip("/")


def relative_location(base: str, delta: str) -> str:
    """How the header of ``delta`` names ``base``: relative to the delta's directory when both
    are local, or both are objects in the same bucket (``../step-1/__0_0.ckz``, a DCP delta's
    base), so that a directory or a prefix of checkpoints can be moved as a whole."""
    if is_url(base) and is_url(delta):
        if _origin(base) != _origin(delta):
            return base
        folder = posixpath.dirname(_split_url(delta)[2])
        return posixpath.relpath(_split_url(base)[2], folder or "/")
    if is_url(base) or is_url(delta):
        return base
    directory = os.path.dirname(os.path.abspath(local_path(delta)))
    return os.path.relpath(os.path.abspath(local_path(base)), directory)
