"""The ``.ckz`` container: a fixed prelude, a JSON header, then the data chunks.

Layout (docs/FORMAT.md has the full specification)::

    offset 0   magic            8 bytes  89 43 4B 5A 0D 0A 1A 0A  ("\\x89CKZ\\r\\n\\x1a\\n")
    offset 8   major version    u16 LE   readers refuse a major they do not know
    offset 10  minor version    u16 LE   additions a reader may ignore
    offset 12  flags            u32 LE   bit 0: the header is deflate-compressed; others 0
    offset 16  header length H  u64 LE   bytes of the stored header, trailing spaces included
    offset 24  header CRC-32C   u32 LE   of the H stored header bytes
    offset 28  prelude CRC-32C  u32 LE   of bytes 0..27
    offset 32  header           H bytes  UTF-8 JSON object, padded with spaces
    offset 32+H data            D bytes  chunks; the header's offsets are relative to here

This module is the header schema's one home: it builds the header a writer stores
(:func:`new_header`, :func:`finish_header`, the leaf entries of :func:`leaf_tables`), packs and
parses the prelude, and turns an untrusted header into validated records whose typed properties
(:class:`Header`, :class:`LeafInfo`) are how every other module reads it: every length, offset,
count and shape is checked against the file's real size before use.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
import threading
import weakref
import zlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, NoReturn, Protocol

from . import _native
from ._version import __version__
from .dtypes import DType, from_name
from .errors import (
    ConfigError,
    CorruptError,
    FormatError,
    TruncatedError,
    UnsupportedError,
    VersionError,
)
from .pipeline import Pipeline
from .policy import DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES
from .tree import MAX_DIMS, Leaf, leaf_names

MAGIC = b"\x89CKZ\r\n\x1a\n"
FORMAT_MAJOR = 1
FORMAT_MINOR = 0
PRELUDE = struct.Struct("<8sHHIQII")
PRELUDE_SIZE = PRELUDE.size  # 32
#: The smallest stored chunk: every non-empty stream has a header of at least this many bytes.
MIN_STORED_CHUNK = 1
#: A lossy leaf's tensor may be at most this many times larger than the array its chunks hold
#: (plus this many bytes), so that a header cannot make a transform's decode allocate without bound.
#: A leaf coded against a base is exempt: the reader checks that the base tensor (real data the
#: caller holds) has the leaf's shape before decoding, so the base bounds it (a sparse delta of an
#: unchanged tensor holds no bytes at all).
MAX_TRANSFORM_EXPANSION = 64


#: Prelude flag: the stored header is a zlib (deflate) stream of the JSON, then optional spaces.
FLAG_DEFLATE = 1
KNOWN_FLAGS = FLAG_DEFLATE
#: A deflated header may inflate to at most this many times its stored size (plus 1 MiB): JSON
#: headers compress 5-20x, and the bound keeps a crafted header from exhausting memory.
MAX_HEADER_EXPANSION = 256


def pack_prelude(header: bytes, flags: int = 0) -> bytes:
    head = PRELUDE.pack(
        MAGIC, FORMAT_MAJOR, FORMAT_MINOR, flags, len(header), _native.crc32c(header), 0
    )
    return head[:28] + struct.pack("<I", _native.crc32c(head[:28]))


#: zlib's level for the stored header. The header is deflated after the last chunk, on one
#: thread, with every other thread idle: level 9 took 38 ms for BitSnap's 313 kB header of the
#: demo GPT's state (its k-means tables) where 6 takes 15 ms, for 83.0 kB against 78.2 kB
#: (0.012% of that 40 MB file; adaptive's: 2.8 ms against 5.6, 0.8 kB more of 2.35 MB).
HEADER_DEFLATE_LEVEL = 6


def store_header(header_json: bytes) -> tuple[bytes, int]:
    """The header as stored, and its flags: deflated when that makes it smaller (it nearly always
    does: key names and tree structure repeat)."""
    deflated = zlib.compress(header_json, HEADER_DEFLATE_LEVEL)
    # a header deflated past what a reader inflates (a list of a million zeros in the state, a
    # long repetitive metadata string) is stored as it is: deflated it saved but never loaded
    if len(deflated) < len(header_json) <= _inflate_limit(len(deflated)):
        return deflated, FLAG_DEFLATE
    return header_json, 0


def _inflate_limit(stored: int) -> int:
    """The most a deflated header of ``stored`` bytes may inflate to (a reader's bound)."""
    return MAX_HEADER_EXPANSION * stored + (1 << 20)


def load_header(stored: bytes, flags: int, source: str) -> bytes:
    """The header's JSON bytes from what a file stores (spaces may pad it)."""
    if not flags & FLAG_DEFLATE:
        return stored
    limit = _inflate_limit(len(stored))
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(stored, limit)
    except zlib.error as exc:
        raise CorruptError(f"{source}: the header does not inflate ({exc}): the file is damaged") from None
    if not inflater.eof:
        what = "is cut short" if not inflater.unconsumed_tail else f"inflates past {limit} bytes"
        raise FormatError(f"{source}: the deflated header {what}; the file is damaged or hostile")
    if inflater.unused_data.strip(b" "):
        raise FormatError(f"{source}: bytes other than padding follow the deflated header")
    return text


@dataclass(frozen=True)
class Prelude:
    major: int
    minor: int
    flags: int
    header_length: int
    header_crc: int


def parse_prelude(data: bytes, file_size: int, source: str) -> Prelude:
    if len(data) < len(MAGIC) or data[: len(MAGIC)] != MAGIC[: len(data)]:
        raise FormatError(
            f"{source}: not a .ckz file (it starts with {bytes(data[:8])!r}, not the ckptzip "
            f"magic); check the path, or compress it first with `ckptzip compress`"
        )
    if len(data) < PRELUDE_SIZE:
        raise TruncatedError(
            f"{source}: truncated: {file_size} bytes, shorter than the {PRELUDE_SIZE}-byte "
            f"prelude; the file was cut off while being written or copied: re-copy or re-save it"
        )
    _, major, minor, flags, header_length, header_crc, prelude_crc = PRELUDE.unpack(
        data[:PRELUDE_SIZE]
    )
    if _native.crc32c(data[:28]) != prelude_crc:
        raise CorruptError(
            f"{source}: the prelude checksum does not match: the file is damaged; restore it "
            f"from another copy"
        )
    if major > FORMAT_MAJOR:
        raise VersionError(
            f"{source}: written with .ckz format version {major}.{minor}, newer than the "
            f"{FORMAT_MAJOR}.{FORMAT_MINOR} this ckptzip reads; upgrade: pip install -U ckptzip"
        )
    if major < 1:
        raise FormatError(f"{source}: format version {major}.{minor} does not exist")
    if flags & ~KNOWN_FLAGS:
        raise VersionError(
            f"{source}: prelude flags 0x{flags:x} include ones this ckptzip does not know; "
            f"upgrade: pip install -U ckptzip"
        )
    if header_length > file_size - PRELUDE_SIZE:
        raise TruncatedError(
            f"{source}: truncated: the header claims {header_length} bytes but the file has "
            f"{file_size - PRELUDE_SIZE} after the prelude; re-copy or re-save it"
        )
    return Prelude(major, minor, flags, header_length, header_crc)


class ChunkRef(NamedTuple):
    """Where one chunk lies and what it must hash to (a tuple: a header holds thousands, and a
    frozen dataclass costs several times as much to build)."""

    offset: int  # in the data section
    length: int  # stored bytes
    crc: int  # CRC-32C of the stored bytes
    raw_crc: int  # CRC-32C of the decoded raw bytes
    raw_length: int


@dataclass(frozen=True, init=False)
class LeafInfo:
    """One stored array, validated. ``dtype``/``shape`` describe the tensor the user gets back;
    ``array_dtype``/``array_shape`` the array the chunks hold, which differ only when the pipeline
    has whole-tensor transforms (lossy modes: codes instead of values)."""

    index: int
    name: str
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    chunk_bytes: int
    pipeline: Pipeline
    chunks: tuple[ChunkRef, ...]
    extra: dict[str, Any]
    array_dtype: DType
    array_shape: tuple[int, ...]
    array_nbytes: int

    def __init__(self, index: int, name: str, dtype: DType, shape: tuple[int, ...], nbytes: int,
                 chunk_bytes: int, pipeline: Pipeline, chunks: tuple[ChunkRef, ...],
                 extra: dict[str, Any], array_dtype: DType, array_shape: tuple[int, ...],
                 array_nbytes: int) -> None:
        # the fields set in one step: a frozen dataclass's own __init__ sets them one by one
        # through object.__setattr__, 4x as slow, and a header builds one of these per tensor
        vars(self).update(index=index, name=name, dtype=dtype, shape=shape, nbytes=nbytes,
                          chunk_bytes=chunk_bytes, pipeline=pipeline, chunks=chunks, extra=extra,
                          array_dtype=array_dtype, array_shape=array_shape,
                          array_nbytes=array_nbytes)

    @property
    def stored_bytes(self) -> int:
        return sum(c.length for c in self.chunks)

    def holds_raw(self, data: Any) -> bool:
        """Whether ``data`` (raw bytes, uint8) is what this leaf's chunks decode to, by their
        CRC-32Cs: the size, and every chunk's raw CRC. For a leaf without whole-tensor
        transforms, that is the tensor itself."""
        if len(data) != self.array_nbytes:
            return False
        for k, chunk in enumerate(self.chunks):
            start = k * self.chunk_bytes
            if _native.crc32c(data[start:start + chunk.raw_length]) != chunk.raw_crc:
                return False
        return True

    @property
    def is_delta(self) -> bool:
        """Whether the tensor was coded against a base tensor (its reference may still be
        malformed: :attr:`base_name` is None then)."""
        return "base" in self.extra

    @property
    def base_name(self) -> str | None:
        """The name of the base tensor it was coded against, or None (no base, or a malformed
        reference)."""
        ref = self.extra.get("base")
        name = ref.get("name") if isinstance(ref, dict) else None
        return name if isinstance(name, str) else None

    @property
    def base_crc(self) -> int | None:
        """The CRC-32C the base tensor it was coded against had, as recorded."""
        ref = self.extra.get("base")
        crc = ref.get("crc") if isinstance(ref, dict) else None
        return crc if isinstance(crc, int) else None

    @property
    def error(self) -> Any:
        """A lossy mode's record of the error it made on this tensor (a dict), or None."""
        return self.extra.get("error")

    @property
    def lossy(self) -> bool:
        """Whether a lossy mode changed this tensor (it carries an error record)."""
        return "error" in self.extra

    @property
    def unchanged(self) -> bool:
        """Whether the writer found the tensor equal to its base tensor."""
        return self.extra.get("unchanged") is True


class BaseRef(NamedTuple):
    """A delta header's reference to its base file."""

    #: The content id the base must have, as stored (a str in files ckptzip writes), or None.
    id: Any
    #: Where the base lies, relative to the delta; None: an in-memory state (or not a str).
    path: str | None


@dataclass(frozen=True)
class Header:
    raw: dict[str, Any]
    leaves: tuple[LeafInfo, ...]
    tree: Any
    data_length: int

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self.raw.get("metadata") or {})

    @property
    def mode(self) -> str:
        return str(self.raw.get("mode", "lossless"))

    @property
    def id(self) -> str:
        """The file's content id (a hash of the header without it)."""
        return str(self.raw.get("id", ""))

    @property
    def version(self) -> Any:
        """The format version the header states (``[major, minor]``)."""
        return self.raw.get("version")

    @property
    def creator(self) -> Any:
        return self.raw.get("creator")

    @property
    def source(self) -> dict[str, Any] | None:
        """How the state's original file was laid out (see :mod:`ckptzip.sources`), or None."""
        source = self.raw.get("source")
        return source if isinstance(source, dict) else None

    @property
    def chain_depth(self) -> int:
        """0 for a standalone checkpoint (a keyframe), else 1 + its base's depth."""
        depth = self.raw.get("chain_depth", 0)
        return depth if type(depth) is int and depth >= 0 else 0

    @property
    def base_ref(self) -> dict[str, Any] | None:
        """The reference to the base this delta was coded against, as stored (None: keyframe)."""
        ref = self.raw.get("base")
        return ref if isinstance(ref, dict) else None

    @property
    def base(self) -> BaseRef | None:
        """The base this delta was coded against (None: a keyframe)."""
        ref = self.base_ref
        if ref is None:
            return None
        path = ref.get("path")
        return BaseRef(ref.get("id"), path if isinstance(path, str) else None)


# -- building a header (writers) -----------------------------------------------------------


def header_json(header: dict[str, Any]) -> bytes:
    """A header's JSON as stored (compact, UTF-8, finite numbers only)."""
    return json.dumps(header, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def check_metadata(metadata: dict[str, Any] | None) -> dict[str, Any]:
    """User metadata as a header stores it: a JSON object with str keys ({} for None)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) for k in metadata):
        raise ConfigError("metadata must be a dict with str keys")
    try:
        header_json(metadata)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"metadata must be JSON-serializable (finite numbers): {exc}") from None
    return metadata


def new_header(mode: str, metadata: dict[str, Any], tree: Any,
               source: dict[str, Any] | None) -> dict[str, Any]:
    """The header's members known before any chunk is coded."""
    header: dict[str, Any] = {
        "format": "ckz",
        "version": [FORMAT_MAJOR, FORMAT_MINOR],
        "creator": f"ckptzip {__version__}",
        "mode": mode,
        "metadata": metadata,
        "tree": tree,
    }
    if source is not None:
        header["source"] = source
    return header


def add_base(header: dict[str, Any], base_id: str | None, location: str | None,
             depth: int) -> None:
    """Name the base file a delta was coded against, and the delta's depth in its chain."""
    header["base"] = {"id": base_id, "path": location}
    header["chain_depth"] = depth


def base_entry(name: str, crc: int, *, unchanged: bool = False) -> dict[str, Any]:
    """A leaf entry's members that say it was coded against base tensor ``name`` (of CRC-32C
    ``crc``), and, if so, that the writer found the tensor unchanged."""
    entry: dict[str, Any] = {"base": {"name": name, "crc": crc}}
    if unchanged:
        entry["unchanged"] = True
    return entry


def encoded_entry(dtype: DType, shape: Sequence[int]) -> dict[str, Any]:
    """A leaf entry's member that describes the array a whole-tensor transform stored."""
    return {"encoded": {"dtype": dtype.name, "shape": list(shape)}}


def refers_to_base(extra: dict[str, Any]) -> bool:
    """Whether a leaf entry's extra members (see :func:`base_entry`) name a base tensor."""
    return "base" in extra


class StoredLeaf(Protocol):
    """What a header's leaf entry is made of: a writer's plan of one leaf once coded."""

    leaf: Leaf
    pipeline: Pipeline
    chunk_bytes: int
    #: Where the leaf's first chunk lies in the data section (-1: none written).
    offset: int
    #: Per chunk ``[stored length, CRC-32C of the stored bytes, CRC-32C of the raw bytes]``.
    table: list[list[int]]
    #: Further members of the entry (:func:`base_entry`, :func:`encoded_entry`, a mode's).
    extra: dict[str, Any]


def leaf_tables(
    plans: Sequence[StoredLeaf], extra_pipelines: Sequence[Pipeline] = ()
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


def finish_header(header: dict[str, Any], plans: Sequence[StoredLeaf],
                  data_length: int) -> tuple[bytes, str]:
    """The header's JSON once every chunk is written, and the file's content id.

    The id hashes the header without it; "id" goes last, so the JSON with it is that JSON with
    one more member before the closing brace (no second encoding of a large header)."""
    header["pipelines"], header["leaves"], header["chunk"] = leaf_tables(plans)
    header["data_length"] = data_length
    body = header_json(header)
    file_id = hashlib.sha256(body).hexdigest()[:32]
    header["id"] = file_id
    return body[:-1] + b',"id":"' + file_id.encode() + b'"}', file_id


def draft_header(header: dict[str, Any], plans: Sequence[StoredLeaf], data_length: int,
                 candidates: Sequence[Pipeline], base_id: str | None,
                 base_location: str | None, against_base: bool) -> bytes:
    """The JSON of a header as :func:`finish_header` would make it from plausible ``plans``
    (drafted before the chunks are coded, to size the header): the pipeline table also holds
    ``candidates``, every leaf names the widest pipeline index, the id is a placeholder and,
    ``against_base``, the chain depth the widest one may be."""
    pipelines, entries, chunk = leaf_tables(plans, extra_pipelines=candidates)
    for entry in entries:
        entry["pipeline"] = len(pipelines)  # the widest index
    full = {**header, "chunk": chunk, "pipelines": pipelines, "leaves": entries,
            "data_length": data_length, "id": "0" * 32}
    if against_base:
        full.update(base={"id": base_id, "path": base_location}, chain_depth=2**31)
    return header_json(full)


def _int(value: Any, what: str, source: str, lo: int = 0, hi: int | None = None) -> int:
    if type(value) is not int or value < lo or (hi is not None and value > hi):
        bound = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise FormatError(f"{source}: {what} is {value!r:.40}, expected an int in {bound}")
    return value


#: Headers parsed and still held somewhere, by a digest of their bytes and the data section's
#: length: a header of 50,000 tensors takes 1.6-2.4 s to parse, and a CheckpointManager's save
#: opens the file it wrote twice (to hold it, to check its chain) and as the next save's base
#: (``held.HeldCheckpoint.header`` keeps it alive in between).
_PARSED: weakref.WeakValueDictionary[tuple[bytes, int], Header] = weakref.WeakValueDictionary()
_PARSED_LOCK = threading.Lock()


def parsed_header(header_bytes: bytes, data_length: int, source: str) -> Header:
    """:func:`parse_header`, or the same header parsed before from the same bytes: a parse
    depends only on them and the data's length (``source`` names the file in its errors)."""
    key = (hashlib.blake2b(header_bytes, digest_size=16).digest(), data_length)
    with _PARSED_LOCK:
        header = _PARSED.get(key)
    if header is None:
        header = parse_header(header_bytes, data_length, source)
        with _PARSED_LOCK:
            _PARSED[key] = header
    return header


def parse_header(header_bytes: bytes, data_length: int, source: str) -> Header:
    """Validate an untrusted header against the real size of the data section."""
    try:
        raw = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{source}: the header is not valid JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != "ckz":
        raise FormatError(f"{source}: the header does not describe a .ckz checkpoint")
    declared = _int(raw.get("data_length"), "data_length", source)
    if declared != data_length:
        cls = TruncatedError if declared > data_length else CorruptError
        raise cls(
            f"{source}: the data section has {data_length} bytes but the header says {declared}; "
            f"the file was cut off or has trailing bytes: re-copy or re-save it"
        )
    entries = raw.get("leaves")
    if not isinstance(entries, list):
        raise FormatError(f"{source}: the header has no leaf table")
    configs = raw.get("pipelines", [])
    if not isinstance(configs, list):
        raise FormatError(f"{source}: the header's pipeline table is not a list")
    pipelines = [Pipeline.from_config(c, f"{source}: pipeline {i}") for i, c in enumerate(configs)]
    chunk = _int(raw.get("chunk", 1), "default chunk size", source, 1, MAX_CHUNK_BYTES)
    names = leaf_names(raw.get("tree"), len(entries))
    leaves = tuple(
        _parse_leaf(i, e, names[i], data_length, source, pipelines, chunk)
        for i, e in enumerate(entries)
    )
    leaves = _name_added(leaves)
    _check_references(leaves, source)
    if not isinstance(raw.get("metadata", {}), dict):
        raise FormatError(f"{source}: header metadata must be an object")
    return Header(raw, leaves, raw.get("tree"), data_length)


def _check_references(leaves: tuple[LeafInfo, ...], source: str) -> None:
    """Leaves that transforms read name other leaves that read none themselves (so there are
    no chains and no cycles), of the dtypes and shapes each transform needs
    (:meth:`~ckptzip.codecs.TensorToTensor.sibling_problem`: low-rank factors are ``rows x r``
    and ``columns x r`` matrices with ``r`` at most the smaller side, so their product costs no
    more than the tensor's size times that side, whatever a file declares; a change mask holds a
    bit per element). A tensor stored at a sibling's support names a sibling of its shape and
    expands at most :data:`MAX_TRANSFORM_EXPANSION` times that sibling's stored array."""
    for leaf in leaves:
        where = f"{source}: tensor {leaf.name!r}"
        for j in leaf.pipeline.references:
            if j >= len(leaves) or j == leaf.index:
                raise FormatError(f"{where}: its transforms read leaf {j}, which is not another leaf")
            if leaves[j].pipeline.references:
                raise FormatError(f"{where}: its transforms read {leaves[j].name!r}, which reads "
                                  f"other leaves itself")
        for stage in leaf.pipeline.transforms:
            siblings = {j: (leaves[j].dtype.name, leaves[j].shape) for j in stage.references}
            problem = stage.sibling_problem(leaf.shape, siblings) if siblings else None
            if problem is not None:
                raise FormatError(f"{where}: {problem}")
        support = leaf.pipeline.support
        if support is None:
            continue
        sibling = leaves[support]
        if sibling.shape != leaf.shape:
            raise FormatError(
                f"{where}: its support names {sibling.name!r}, which has shape "
                f"{list(sibling.shape)}, not {list(leaf.shape)}"
            )
        if leaf.nbytes > MAX_TRANSFORM_EXPANSION * (leaf.array_nbytes + sibling.array_nbytes + 1):
            raise FormatError(f"{where}: {leaf.nbytes} bytes claimed from encoded arrays of "
                              f"{leaf.array_nbytes + sibling.array_nbytes}")


def added_leaves(leaves: tuple[LeafInfo, ...]) -> set[int]:
    """Indices of the leaves a writer added as parts of other tensors (low-rank factors, change
    masks), which the state does not hold."""
    return {j for leaf in leaves for stage in leaf.pipeline.transforms
            for j in stage.added_leaves(leaf.name)}


def _name_added(leaves: tuple[LeafInfo, ...]) -> tuple[LeafInfo, ...]:
    """Added leaves, which the tree does not reference, named after their tensor
    (``<name>:lowrank.u``, ``<name>:changed``) instead of ``<unreferenced i>``."""
    names: dict[int, str] = {}
    for leaf in leaves:
        for stage in leaf.pipeline.transforms:
            for j, name in stage.added_leaves(leaf.name).items():
                names.setdefault(j, name)
    return tuple(replace(leaf, name=names[leaf.index])
                 if leaf.index in names and leaf.name.startswith("<unreferenced") else leaf
                 for leaf in leaves)


def _parse_leaf(
    index: int, entry: Any, name: str, data_length: int, source: str, pipelines: list[Pipeline],
    default_chunk: int,
) -> LeafInfo:
    if not isinstance(entry, dict):
        raise FormatError(f"{source}: leaf {index} is not an object")
    where = f"{source}: tensor {name!r}"
    dtype, dims, nbytes = _array_type(entry, where)
    width = 1
    pipeline = pipelines[_int(entry.get("pipeline"), "pipeline index", where, 0, len(pipelines) - 1)]
    array_dtype, array_dims, array_nbytes = dtype, dims, nbytes
    encoded = entry.get("encoded")
    if pipeline.transforms:
        if not isinstance(encoded, dict):
            raise FormatError(f"{where}: a pipeline with transforms needs an 'encoded' array")
        array_dtype, array_dims, array_nbytes = _array_type(encoded, where)
        # a tensor stored at a sibling's support is bounded by that sibling (checked in
        # _check_references); one coded against a base, by the base
        bounded_elsewhere = "base" in entry or pipeline.support is not None
        if nbytes > MAX_TRANSFORM_EXPANSION * (array_nbytes + 1) and not bounded_elsewhere:
            raise FormatError(
                f"{where}: {nbytes} bytes claimed from an encoded array of {array_nbytes}"
            )
    elif encoded is not None:
        raise FormatError(f"{where}: an 'encoded' array without transforms")
    for transform in pipeline.transforms:  # a transform that declares its size must match the leaf
        numel = getattr(transform, "numel", None)
        if numel is not None and numel != math.prod(dims):
            raise FormatError(f"{where}: its {transform.codec_id} stage declares {numel} elements, "
                              f"the tensor has {math.prod(dims)}")
    if pipeline.needs_base and not isinstance(entry.get("base"), dict):
        raise FormatError(f"{where}: a residual pipeline without a base reference")
    if pipeline.serializer is not None:
        width = pipeline.serializer.width
    chunk_bytes = _int(entry.get("chunk", default_chunk), "chunk size", where, 1, MAX_CHUNK_BYTES)
    if chunk_bytes % width:
        raise FormatError(f"{where}: chunk size {chunk_bytes} is not a multiple of {width}")
    table = entry.get("chunks")
    n_chunks = -(-array_nbytes // chunk_bytes)
    if not isinstance(table, list) or len(table) != n_chunks:
        raise FormatError(
            f"{where}: {array_nbytes} raw bytes in {chunk_bytes}-byte chunks need {n_chunks} chunk "
            f"entries, the header has {len(table) if isinstance(table, list) else 'none'}"
        )
    offset = _int(entry.get("offset"), "data offset", where, 0, data_length)
    if array_nbytes % width:  # chunk_bytes is a multiple of width, so only the last chunk can be
        raise FormatError(f"{where}: chunk {n_chunks - 1} is not a whole number of elements")
    chunks = []
    last = n_chunks - 1
    for k, item in enumerate(table):
        # one combined test per chunk (a header holds thousands); the messages only on failure
        if not (type(item) is list and len(item) == 3 and type(item[0]) is int
                and type(item[1]) is int and type(item[2]) is int
                and MIN_STORED_CHUNK <= item[0] <= data_length - offset
                and 0 <= item[1] <= 0xFFFFFFFF and 0 <= item[2] <= 0xFFFFFFFF):
            _bad_chunk(k, item, data_length - offset, where)
        length = item[0]
        raw_length = chunk_bytes if k < last else array_nbytes - k * chunk_bytes
        chunks.append(ChunkRef(offset, length, item[1], item[2], raw_length))
        offset += length
    extra = {k: v for k, v in entry.items()
             if k not in ("dtype", "shape", "pipeline", "chunk", "chunks", "offset", "encoded")}
    return LeafInfo(index, name, dtype, dims, nbytes, chunk_bytes, pipeline, tuple(chunks), extra,
                    array_dtype, array_dims, array_nbytes)


def _bad_chunk(k: int, item: Any, room: int, where: str) -> NoReturn:
    """Raises the error that says what is wrong with chunk entry ``k`` (fast path failed)."""
    if not isinstance(item, list) or len(item) != 3:
        raise FormatError(f"{where}: chunk {k} entry must be [length, crc, raw_crc]")
    _int(item[0], f"chunk {k} length", where, MIN_STORED_CHUNK, room)
    _int(item[1], f"chunk {k} crc", where, 0, 0xFFFFFFFF)
    _int(item[2], f"chunk {k} raw crc", where, 0, 0xFFFFFFFF)
    raise FormatError(f"{where}: chunk {k} entry {item!r:.80} is not valid")


def _array_type(entry: dict[str, Any], where: str) -> tuple[DType, tuple[int, ...], int]:
    """An entry's ``dtype`` and ``shape``, validated, and the byte size they make."""
    try:
        dtype = from_name(str(entry.get("dtype")))
    except UnsupportedError as exc:
        raise FormatError(f"{where}: {exc}") from None
    dims = _dims(entry.get("shape"), where)
    return dtype, dims, math.prod(dims) * dtype.itemsize


def _dims(shape: Any, where: str) -> tuple[int, ...]:
    if not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise FormatError(f"{where}: shape must be a list of at most {MAX_DIMS} dims")
    for d in shape:
        if type(d) is not int or d < 0:
            _int(d, "a shape dim", where)  # raises, saying what is wrong
    return tuple(shape)
