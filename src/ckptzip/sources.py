"""Reading what users have (safetensors files, torch.save files, Hugging Face checkpoint
directories) into states, and writing states back out in those forms, for the command line.

A safetensors file keeps its original header in the ``.ckz`` so that decompressing it gives back
the same file, byte for byte. Directories keep every file: tensor files as states, the rest
(config.json, tokenizer files, trainer_state.json) as bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import io
import json
import os
import secrets
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import torch

from .errors import Error, FormatError, UnsupportedError
from .objstore import StorageOptions
from .storage import atomic_write, directory_mode, is_url, remove_temp, temp_prefix

SAFETENSORS_SUFFIXES = (".safetensors",)
TORCH_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
#: safetensors caps its header at 100 MB; so do we.
MAX_SAFETENSORS_HEADER = 100_000_000


@dataclass
class Loaded:
    """A source read into a state, plus what is needed to write it back in its own form."""

    state: Any
    source: dict[str, Any]


def read_safetensors(path: str) -> Loaded:
    from safetensors.torch import load_file

    with _opened(path) as handle:
        prefix = handle.read(8)
        if len(prefix) < 8:
            raise Error(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_SAFETENSORS_HEADER:
            raise Error(f"{path}: not a safetensors file (header length {length} is absurd)")
        header = handle.read(length)
    try:
        meta = json.loads(header).get("__metadata__") or {}
        tensors = load_file(path)
    except Exception as exc:
        raise Error(f"{path}: cannot read as safetensors: {exc}") from None
    return Loaded(tensors, {"kind": "safetensors", "header": header.decode("utf-8"), "metadata": meta})


def _unreadable(path: str, exc: OSError) -> Error:
    return Error(f"{path}: cannot read ({exc.strerror or exc}); check that it is a file you may "
                 f"read")


@contextlib.contextmanager
def _opened(path: str) -> Iterator[IO[bytes]]:
    """``open(path, "rb")``, its failure (no permission, a directory) a ckptzip Error."""
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    with handle:
        yield handle


def read_torch(path: str) -> Loaded:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except OSError as exc:  # a file we cannot read is said so, not blamed on its contents
        raise _unreadable(path, exc) from None
    except Exception as exc:  # torch raises many types here; report them all the same way
        first = next(iter(str(exc).splitlines()), "") or type(exc).__name__  # EOFError: none
        raise Error(
            f"{path}: cannot read with torch.load(weights_only=True): {first}; "
            f"ckptzip only reads files that load without running code"
        ) from None
    return Loaded(state, {"kind": "torch"})


def read_directory(path: str) -> Loaded:
    """Every file under ``path``: tensor files as states, the rest as bytes, and the empty
    directories by name. A symbolic link is read as what it names (a Hugging Face cache's
    snapshot is links into its blobs; a linked directory is walked) and restored as a plain
    file or directory; a link that names nothing, or a directory link that loops back, is an
    error, never something silently left out."""
    files: dict[str, Any] = {}
    kinds: dict[str, Any] = {}
    empty: list[str] = []

    def unreadable(exc: OSError) -> None:  # os.walk would skip the directory, and its files
        raise Error(f"{exc.filename or path}: cannot read the directory ({exc.strerror or exc}); "
                    f"make it readable (or move it out of {path}), then compress again") from exc

    for root, dirs, names in os.walk(path, onerror=unreadable, followlinks=True):
        dirs.sort()
        here = os.path.realpath(root)
        for name in dirs:
            linked = os.path.realpath(os.path.join(root, name))
            if here == linked or here.startswith(linked.rstrip(os.sep) + os.sep):
                raise Error(f"{os.path.join(root, name)}: a link to a directory that holds it, "
                            f"a loop; remove the link, then compress the directory again")
        if not dirs and not names and root != path:
            empty.append(os.path.relpath(root, path).replace(os.sep, "/"))
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            if not os.path.isfile(full):  # follows links
                what = "a link to nothing" if os.path.islink(full) else "not a regular file"
                raise Error(f"{full}: {what}; remove it or copy what it should hold, then "
                            f"compress the directory again")
            loaded = read_file(full, inside_directory=True)
            files[rel] = loaded.state
            kinds[rel] = loaded.source
    if not files:
        raise Error(f"{path}: the directory holds no files to compress")
    source: dict[str, Any] = {"kind": "directory", "files": kinds}
    if empty:
        source["empty_dirs"] = empty
    return Loaded({"files": files}, source)


def read_file(path: str, *, inside_directory: bool = False) -> Loaded:
    """A file as a state. Inside a directory, a torch file that does not load without running
    code (a Trainer's ``training_args.bin``, ``rng_state.pth`` with numpy's state) is kept as
    bytes, as every other file there is; alone, it is an error."""
    lower = path.lower()
    if lower.endswith(SAFETENSORS_SUFFIXES):
        return read_safetensors(path)
    if lower.endswith(TORCH_SUFFIXES):
        try:
            return read_torch(path)
        except Error:
            if not inside_directory:
                raise
    if inside_directory:
        with _opened(path) as handle:
            return Loaded(handle.read(), {"kind": "bytes"})
    raise Error(
        f"{path}: unknown input; ckptzip compresses .safetensors files, torch.save files "
        f"({', '.join(TORCH_SUFFIXES)}) and checkpoint directories"
    )


def read_source(path: str) -> Loaded:
    if os.path.isdir(path):
        return read_directory(path)
    if not os.path.exists(path):
        raise Error(f"{path}: no such file or directory")
    return read_file(path)


def _named_values(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every value of a state of dicts, lists and tuples other than those, by its dotted key
    path (``<root>``'s is ``""``)."""
    if isinstance(value, dict):
        for key, child in value.items():
            yield from _named_values(child, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, (list, tuple)):
        for i, child in enumerate(value):
            yield from _named_values(child, f"{prefix}.{i}" if prefix else str(i))
    else:
        yield prefix, value


def flat_tensors(state: Any, where: str) -> dict[str, torch.Tensor]:
    """A nested state as ``{"dotted.key": tensor}``, for formats that only hold flat tensors."""
    flat: dict[str, torch.Tensor] = {}
    for name, value in _named_values(state):
        if not isinstance(value, torch.Tensor):
            raise UnsupportedError(
                f"{where}: {name or '<root>'} is a {type(value).__name__}, which safetensors "
                f"cannot hold; decompress with --to pt instead"
            )
        if name in flat:  # {"a": {"b": x}} beside {"a.b": y}: one would be lost
            raise UnsupportedError(
                f"{where}: two tensors are named {name!r} once their keys are joined with dots, "
                f"and safetensors holds one name once; decompress with --to pt"
            )
        flat[name] = value
    return flat


#: What to do when a file's stored safetensors layout is damaged (the command line's words).
FRESH_LAYOUT_ADVICE = ("decompress with --to safetensors for the same tensors in a fresh layout, "
                       "or with --to pt")


def write_safetensors(state: Any, source: dict[str, Any], path: str,
                      storage_options: StorageOptions = None, mode: int | None = None, *,
                      if_damaged: str | None = FRESH_LAYOUT_ADVICE) -> bool:
    """Write tensors as safetensors; returns whether it is the original file's layout.

    A state compressed from a safetensors file gets that file back byte for byte: its stored
    header is replayed once it is checked to describe exactly these tensors
    (:func:`_stored_layout`). A stored layout that does not is damaged: a FormatError that ends
    with ``if_damaged`` (what to do), never a different file than the original; with
    ``if_damaged=None`` (the user asked for safetensors, not for the original) the tensors get
    a fresh layout instead."""
    tensors = flat_tensors(state, path)
    if source.get("kind") == "safetensors":
        try:
            raw_header, order = _stored_layout(tensors, source.get("header"))
        except ValueError as exc:
            if if_damaged is not None:
                raise FormatError(
                    f"{path}: cannot be restored byte for byte: the safetensors layout stored for "
                    f"it in the checkpoint is damaged ({exc}); {if_damaged}") from None
        else:
            _write_layout(tensors, raw_header, order, path, storage_options, mode)
            return True
    from safetensors.torch import save

    dense = {k: _dense(v, k, path) for k, v in tensors.items()}
    _refuse_what_safetensors_cannot_hold(dense, path)
    meta = source.get("metadata")
    data = save(dense, metadata=meta if _is_text_map(meta) else None)
    with atomic_write(path, storage_options, mode) as handle:
        handle.write(data)
    return False


def _dense(tensor: torch.Tensor, name: str, path: str) -> torch.Tensor:
    """``tensor.contiguous()``, as safetensors stores it. A view whose stride repeats elements
    (an expanded tensor) grows to its full size here: its failure to fit in memory is an
    Error naming it, not torch's."""
    try:
        return tensor.contiguous()
    except RuntimeError as exc:
        raise Error(f"{path}: {name} takes {tensor.numel() * tensor.element_size():,} bytes "
                    f"stored densely, as safetensors must, and they cannot be had "
                    f"({str(exc).splitlines()[0][:120]}); decompress with --to pt, which keeps "
                    f"views as views") from None


_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "F8_E8M0": torch.float8_e8m0fnu,
    "C64": torch.complex64, "F4": torch.float4_e2m1fn_x2,
}
#: Dtypes whose torch tensor packs several of the header's elements into one: safetensors'
#: shape counts the elements, torch's the packed bytes (the last dimension).
_ST_PACKED = {"F4": 2}
#: The torch dtypes a safetensors file can hold (safetensors' save fails on the others).
_ST_WRITABLE = frozenset(_ST_DTYPES.values())


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _few(names: list[str], shown: int = 3) -> str:
    """``a, b, c`` or ``a, b, c and 4 more``: names for a message."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _is_text_map(value: Any) -> bool:
    """Whether ``value`` is what safetensors' metadata must be: a dict of str to str."""
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                           for k, v in value.items())


def _counts(value: Any, length: int | None = None) -> bool:
    """Whether ``value`` is a list of whole numbers from 0 (of ``length`` of them, if given):
    a shape or a pair of offsets (JSON's 4.0 or true are not)."""
    return (isinstance(value, list) and (length is None or len(value) == length)
            and all(type(n) is int and n >= 0 for n in value))


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: a key given twice is refused (which of the two would a reader take?)."""
    result = dict(pairs)
    if len(result) != len(pairs):
        keys = [key for key, _ in pairs]
        twice = next(key for key in keys if keys.count(key) > 1)
        raise ValueError(f"its header names {twice!r} twice")
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"its header holds {name}, which is not JSON")


def _stored_layout(tensors: dict[str, torch.Tensor], header_text: Any) -> tuple[bytes, list[str]]:
    """The stored safetensors header's bytes and the tensors' names in the order of their data,
    once the header is checked to describe exactly ``tensors``: the same names, each entry's
    dtype and shape the tensor's, and data offsets that tile the data from byte 0, each tensor's
    span its size, without gaps or overlaps (what safetensors itself demands of a file). A
    ValueError saying what is wrong otherwise: the header is not trusted."""
    if not isinstance(header_text, str):
        raise ValueError(f"its header is a {type(header_text).__name__}, not JSON text")
    raw_header = header_text.encode("utf-8")
    if len(raw_header) > MAX_SAFETENSORS_HEADER:
        raise ValueError(f"its header takes {len(raw_header):,} bytes, more than safetensors reads")
    try:
        header = json.loads(header_text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("its header nests too deeply") from None
    if not isinstance(header, dict):
        raise ValueError(f"its header is a JSON {type(header).__name__}, not an object")
    metadata = header.get("__metadata__")
    if metadata is not None and not _is_text_map(metadata):
        raise ValueError("its __metadata__ is not a mapping of strings to strings")
    entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
    if set(entries) != set(tensors):
        extra, missing = sorted(set(entries) - set(tensors)), sorted(set(tensors) - set(entries))
        raise ValueError("; ".join(
            [f"it names tensors the checkpoint does not hold: {_few(extra)}"] * bool(extra)
            + [f"it lacks tensors the checkpoint holds: {_few(missing)}"] * bool(missing)))
    spans: list[tuple[int, int, str]] = []
    for name, entry in entries.items():
        tensor = tensors[name]
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: its entry is a {type(entry).__name__}, not an object")
        dtype, shape = entry.get("dtype"), entry.get("shape")
        offsets: Any = entry.get("data_offsets")
        if not isinstance(dtype, str) or _ST_DTYPES.get(dtype) != tensor.dtype:
            raise ValueError(f"{name}: dtype {dtype!r}, not the tensor's {_dtype_name(tensor.dtype)}")
        expected = list(tensor.shape)
        if expected and dtype in _ST_PACKED:
            expected[-1] *= _ST_PACKED[dtype]
        if not _counts(shape) or shape != expected:
            raise ValueError(f"{name}: shape {shape!r}, not the tensor's {expected}")
        size = tensor.numel() * tensor.element_size()
        if not _counts(offsets, 2) or offsets[1] - offsets[0] != size:
            raise ValueError(f"{name}: data_offsets {offsets!r}, not a span of the tensor's "
                             f"{size:,} bytes")
        spans.append((offsets[0], offsets[1], name))
    spans.sort()
    end = 0
    for begin, finish, name in spans:
        if begin != end:
            raise ValueError(f"{name}: its data starts at byte {begin:,}, not at {end:,}, where "
                             f"the data before it ends (a gap or an overlap)")
        end = finish
    return raw_header, [name for _, _, name in spans]


def _write_layout(tensors: dict[str, torch.Tensor], raw_header: bytes, order: list[str], path: str,
                  storage_options: StorageOptions = None, mode: int | None = None) -> None:
    """A safetensors file of ``raw_header`` and the tensors' bytes, one after another in
    ``order`` (:func:`_stored_layout` checked that they tile the data so)."""
    with atomic_write(path, storage_options, mode) as handle:
        handle.write(struct.pack("<Q", len(raw_header)) + raw_header)
        for name in order:
            flat = _dense(tensors[name], name, path).reshape(-1)
            if flat.numel():
                handle.write(flat.view(torch.uint8).numpy().data)


def _refuse_what_safetensors_cannot_hold(tensors: dict[str, torch.Tensor], path: str) -> None:
    """An UnsupportedError naming the tensors safetensors' save would fail on: a dtype it has
    no name for, or memory two of them share (tied weights: safetensors stores each name's
    bytes once and refuses aliases)."""
    foreign = [(name, t.dtype) for name, t in tensors.items() if t.dtype not in _ST_WRITABLE]
    if foreign:
        what = _few([f"{name} ({_dtype_name(dtype)})" for name, dtype in foreign])
        advice = ("decompress with --to pt, which keeps every dtype"
                  if all(_torch_saves(dtype) for _, dtype in foreign) else
                  "torch.save cannot store it either: read the checkpoint in Python with "
                  "ckptzip.load")
        raise UnsupportedError(f"{path}: safetensors has no dtype for {what}; {advice}")
    shared = _sharing_memory(tensors)
    if shared:
        pairs = _few([f"{first} and {second}" for first, second in shared])
        raise UnsupportedError(
            f"{path}: {pairs} share memory (tied weights), which a safetensors file cannot "
            f"hold, and dropping a name would lose it; decompress with --to pt, which keeps "
            f"them shared")


def _sharing_memory(tensors: dict[str, torch.Tensor]) -> list[tuple[str, str]]:
    """Pairs of the (contiguous) ``tensors`` whose bytes overlap, as tied weights' do."""
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name)
                   for name, t in tensors.items() if t.numel() and t.data_ptr())
    pairs: list[tuple[str, str]] = []
    reach, holder = 0, ""
    for start, end, name in spans:
        if start < reach:
            pairs.append((holder, name))
        if end > reach:
            reach, holder = end, name
    return pairs


@functools.cache
def _torch_saves(dtype: torch.dtype) -> bool:
    """Whether torch.save can store a tensor of ``dtype`` (it has no storage type for the
    sub-byte ints, uint1 to uint7 and int1 to int7, and fails with a KeyError)."""
    try:
        torch.save(torch.empty(0, dtype=dtype), io.BytesIO())
    except KeyError:
        return False
    except Exception:  # no empty tensor of it to try (a quantized dtype): not this failure
        return True
    return True


def _refuse_what_torch_cannot_save(state: Any, path: str) -> None:
    """An UnsupportedError naming the tensors of ``state`` whose dtype torch.save cannot store."""
    found = [f"{name or '<root>'} ({_dtype_name(value.dtype)})"
             for name, value in _named_values(state)
             if isinstance(value, torch.Tensor) and not _torch_saves(value.dtype)]
    if found:
        raise UnsupportedError(f"{path}: torch.save has no storage type for {_few(found)}, so no "
                               f"torch.save file can hold it; read the checkpoint in Python with "
                               f"ckptzip.load")


class _Watched:
    """A file object that keeps the first exception its ``write`` or ``flush`` raised: torch.save's
    zip writer swallows it (an OSError from a full disk, an interrupt) and raises its own
    RuntimeError ("unexpected pos"), which :func:`write_torch` replaces by the real one. Once
    ``dropped`` (the save failed; the file is discarded) it takes writes without writing: an
    interrupt as torch.save finished leaves its zip writer unfinished, and the writer, freed
    later with the exception's frames, writes its end then, into the closed file: a ValueError
    in its C++ destructor, which aborts the process."""

    def __init__(self, handle: IO[bytes]) -> None:
        self.handle = handle
        self.failure: BaseException | None = None
        self.dropped = False

    def write(self, data: Any) -> int:
        if self.dropped:
            return memoryview(data).nbytes
        try:
            return self.handle.write(data)
        except BaseException as exc:
            self.failure = self.failure or exc
            raise

    def flush(self) -> None:
        if self.dropped:
            return
        try:
            self.handle.flush()
        except BaseException as exc:
            self.failure = self.failure or exc
            raise

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def _real_failure(exc: BaseException, watched: _Watched) -> BaseException | None:
    """What torch.save's ``exc`` hides: the write's own failure, else an interrupt (Ctrl-C,
    SIGTERM) it was raised while handling; None when ``exc`` is the failure itself, or an
    interrupt itself (Ctrl-C during the clean-up of a full disk's failure stays Ctrl-C)."""
    if not isinstance(exc, Exception):
        return None
    if watched.failure is not None:
        return None if watched.failure is exc else watched.failure
    context = exc.__context__
    while context is not None:
        if not isinstance(context, Exception):
            return context
        context = context.__context__
    return None


def write_torch(state: Any, path: str, storage_options: StorageOptions = None,
                mode: int | None = None) -> None:
    """``torch.save`` to ``path``, atomically; a full disk or a size limit is the ckptzip Error
    that ``atomic_write`` makes of its OSError, and an interrupt stays one; a dtype it has no
    storage type for is an UnsupportedError naming the tensor, before anything is written."""
    _refuse_what_torch_cannot_save(state, path)
    with atomic_write(path, storage_options, mode) as handle:
        watched = _Watched(handle)
        try:
            torch.save(state, watched)
        except BaseException as exc:
            watched.dropped = True
            failure = _real_failure(exc, watched)
            if failure is None:
                raise
            raise failure from None


def write_directory(state: Any, source: dict[str, Any], path: str) -> None:
    """Write a directory's files back. They go into a new directory beside ``path``, which then
    takes its place: an existing ``path`` (decompress -f) is replaced whole, never left half
    old and half new, and a failure or an interrupt leaves it as it was."""
    files = state.get("files") if isinstance(state, dict) else None
    if not isinstance(files, dict):
        raise Error(f"{path}: this checkpoint was not compressed from a directory; use --to pt")
    if is_url(path):
        raise Error(f"{path}: a checkpoint directory is written to a local path only; pass "
                    f"-o DIR, or --to pt for one file")
    kinds = source.get("files", {})
    if not isinstance(kinds, dict):
        raise Error(f"{path}: the checkpoint's header lists its files' kinds as a "
                    f"{type(kinds).__name__}, not a mapping: it is damaged; use --to pt")
    empty = source.get("empty_dirs", [])
    if not isinstance(empty, list):
        raise Error(f"{path}: the checkpoint's header lists its empty directories as a "
                    f"{type(empty).__name__}, not a list: it is damaged; use --to pt")
    shown = path.rstrip("/" + os.sep) or path  # the messages' name for the new directory
    target = os.path.abspath(shown)
    if os.path.lexists(target) and not os.path.isdir(target):
        raise Error(f"{path}: exists and is not a directory; remove it or pass another -o")
    parent = os.path.dirname(target)
    prefix = temp_prefix(parent, os.path.basename(target))
    fresh = ""
    try:  # from before mkdtemp: an interrupt as it returns must not leave its folder behind
        try:
            os.makedirs(parent, exist_ok=True)
            fresh = tempfile.mkdtemp(prefix=prefix, dir=parent)
        except OSError as exc:
            raise Error(f"{path}: cannot create a directory in {parent} ({exc.strerror or exc}); "
                        f"check that it is writable") from None
        for rel in empty:
            _make_folder(_inside_output(fresh, rel, path))
        for rel, content in files.items():
            file = _inside_output(fresh, rel, path)
            _make_folder(os.path.dirname(file))
            kind = kinds.get(rel, {})
            if isinstance(content, bytes):
                with atomic_write(file) as handle:
                    handle.write(content)
                continue
            if not isinstance(kind, dict) or (source.get("kind") == "directory"
                                              and kind.get("kind") not in ("safetensors", "torch")):
                raise FormatError(f"{file}: the checkpoint's header gives its kind as {kind!r}, "
                                  f"not a safetensors or a torch.save file's: it is damaged; "
                                  f"{_WHOLE_STATE_ADVICE}")
            if kind.get("kind") == "safetensors":
                write_safetensors(content, kind, file, if_damaged=_WHOLE_STATE_ADVICE)
            else:
                write_torch(content, file)
        with contextlib.suppress(OSError):  # mkdtemp makes 0700: a plain mkdir's mode instead
            os.chmod(fresh, directory_mode())
        _swap_in(fresh, target, shown)
    except BaseException as exc:
        remove_temp(parent, prefix, fresh)
        if fresh and isinstance(exc, Error) and fresh in str(exc):
            # name the output's own path (out/sub/x), not the temporary folder's
            raise type(exc)(str(exc).replace(fresh, shown)) from exc.__cause__
        raise


#: What to do when a directory's header is damaged: its files' contents as one torch.save file.
_WHOLE_STATE_ADVICE = "decompress with --to pt for every file's contents in one torch.save file"


def _make_folder(folder: str) -> None:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise Error(f"{folder}: cannot create the directory ({exc.strerror or exc}); nothing was "
                    f"written and the previous directory, if any, is intact; free space (or "
                    f"inodes) or fix permissions and retry") from exc


def _inside_output(fresh: str, rel: Any, path: str) -> str:
    """Where the header's relative name ``rel`` goes under ``fresh``; a name that would reach
    outside it (absolute, empty parts, ``.`` or ``..``: the header is not trusted) is refused,
    and so is one that no file name can be (a NUL in it)."""
    if isinstance(rel, str) and "\x00" in rel:
        raise FormatError(f"{path}: the checkpoint's header names a file or directory {rel!r}, "
                          f"with a NUL character, which no file name can hold: it is damaged; "
                          f"{_WHOLE_STATE_ADVICE}")
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise Error(f"{path}: refusing to write outside the output directory: {rel!r}")
    return os.path.join(fresh, *parts)


#: Linux's renameat2 flag that swaps two paths in one step, and "the current directory".
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(first: str, second: str) -> bool:
    """Swap ``first`` and ``second`` atomically (Linux's ``renameat2(RENAME_EXCHANGE)``);
    False where that is not to be had (no such call in the C library or the kernel, or a
    filesystem without it), OSError where the swap itself was refused."""
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    if call(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second),
            _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), first, None, second)


def _swap_in(fresh: str, target: str, shown: str) -> None:
    """Put the finished directory ``fresh`` at ``target``: a rename where nothing is there;
    else the two swap places in one step where the system can (``fresh`` then holds the old
    one, removed last), so a kill leaves the old or the new directory at ``target``, never
    neither. Elsewhere the old one is renamed aside first (a name with the temporary marker),
    put back if the new one cannot take its place, and removed once it has. A link at
    ``target`` is replaced, not what it names."""
    old = ""
    replacing = os.path.lexists(target)
    try:
        if not replacing:
            os.rename(fresh, target)
            return
        if _exchange(fresh, target):
            old = fresh
        else:
            parent = os.path.dirname(target)
            old = os.path.join(parent, temp_prefix(parent, os.path.basename(target), "old-")
                               + secrets.token_hex(4))
            os.rename(target, old)
            try:
                os.rename(fresh, target)
            except BaseException:
                try:
                    os.rename(old, target)  # the previous directory back where it was
                except OSError as exc:
                    raise Error(f"{shown}: the new directory could not take its place, nor "
                                f"the previous one go back ({exc.strerror or exc}); the "
                                f"previous one is at {old}: rename it back") from exc
                raise
    except OSError as exc:
        if not replacing:
            raise Error(f"{shown}: cannot rename the new directory into place "
                        f"({exc.strerror or exc}); check that nothing else is writing there, "
                        f"then retry") from exc
        raise Error(f"{shown}: cannot put the new directory in place of the existing one "
                    f"({exc.strerror or exc}); that one is intact. A mount point, or another "
                    f"user's directory in a sticky folder such as /tmp, cannot be replaced: "
                    f"pass another -o, or empty it and decompress into a fresh one") from exc
    remove_temp(os.path.dirname(old), "", old)
