"""Reading what users have (safetensors files, torch.save files, Hugging Face checkpoint
directories) into states, and writing states back out in those forms, for the command line.

A safetensors file keeps its original header in the ``.ckz`` so that decompressing it gives back
the same file, byte for byte. Directories keep every file: tensor files as states, the rest
(config.json, tokenizer files, trainer_state.json) as bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

import torch

from .errors import Error, UnsupportedError
from .objstore import StorageOptions
from .storage import TEMP_MARKER, atomic_write, is_url

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
    for root, dirs, names in os.walk(path, followlinks=True):
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


def flat_tensors(state: Any, where: str) -> dict[str, torch.Tensor]:
    """A nested state as ``{"dotted.key": tensor}``, for formats that only hold flat tensors."""
    flat: dict[str, torch.Tensor] = {}

    def walk(value: Any, prefix: str) -> None:
        if isinstance(value, torch.Tensor):
            flat[prefix] = value
        elif isinstance(value, dict):
            for key, child in value.items():
                walk(child, f"{prefix}.{key}" if prefix else str(key))
        elif isinstance(value, (list, tuple)):
            for i, child in enumerate(value):
                walk(child, f"{prefix}.{i}" if prefix else str(i))
        else:
            raise UnsupportedError(
                f"{where}: {prefix or '<root>'} is a {type(value).__name__}, which safetensors "
                f"cannot hold; decompress with --to pt instead"
            )

    walk(state, "")
    return flat


def write_safetensors(state: Any, source: dict[str, Any], path: str,
                      storage_options: StorageOptions = None, mode: int | None = None) -> None:
    """Write tensors as safetensors; reproduce the original file exactly when its header is
    known and still describes these tensors."""
    tensors = flat_tensors(state, path)
    header_text = source.get("header") if source.get("kind") == "safetensors" else None
    if isinstance(header_text, str) and _write_original_layout(tensors, header_text, path,
                                                               storage_options, mode):
        return
    from safetensors.torch import save

    meta = source.get("metadata") if isinstance(source.get("metadata"), dict) else None
    data = save({k: _dense(v, k, path) for k, v in tensors.items()}, metadata=meta)
    with atomic_write(path, storage_options, mode) as handle:
        handle.write(data)


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
    "F8_E8M0": torch.float8_e8m0fnu,
    "C64": torch.complex64, "F4": torch.float4_e2m1fn_x2,
}
#: Dtypes whose torch tensor packs several of the header's elements into one: safetensors'
#: shape counts the elements, torch's the packed bytes (the last dimension).
_ST_PACKED = {"F4": 2}


def _write_original_layout(tensors: dict[str, torch.Tensor], header_text: str, path: str,
                           storage_options: StorageOptions = None,
                           mode: int | None = None) -> bool:
    try:
        header = json.loads(header_text)
    except ValueError:
        return False
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    if set(entries) != set(tensors):
        return False
    data_size = 0
    for name, entry in entries.items():
        tensor = tensors[name]
        begin, end = entry["data_offsets"]
        shape = list(tensor.shape)
        if shape and entry["dtype"] in _ST_PACKED:
            shape[-1] *= _ST_PACKED[entry["dtype"]]
        if (_ST_DTYPES.get(entry["dtype"]) != tensor.dtype or shape != entry["shape"]
                or end - begin != tensor.numel() * tensor.element_size()):
            return False
        data_size = max(data_size, end)
    raw_header = header_text.encode("utf-8")
    with atomic_write(path, storage_options, mode) as handle:
        handle.write(struct.pack("<Q", len(raw_header)) + raw_header)
        handle.truncate(8 + len(raw_header) + data_size)
        for name, entry in entries.items():
            handle.seek(8 + len(raw_header) + entry["data_offsets"][0])
            flat = tensors[name].contiguous().reshape(-1)
            handle.write(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return True


def write_torch(state: Any, path: str, storage_options: StorageOptions = None,
                mode: int | None = None) -> None:
    with atomic_write(path, storage_options, mode) as handle:
        torch.save(state, handle)


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
    target = os.path.abspath(path.rstrip("/" + os.sep) or path)
    if os.path.exists(target) and not os.path.isdir(target):
        raise Error(f"{path}: exists and is not a directory; remove it or pass another -o")
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        fresh = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}{TEMP_MARKER}", dir=parent)
    except OSError as exc:
        raise Error(f"{path}: cannot create a directory in {parent} ({exc.strerror or exc}); "
                    f"check that it is writable") from None
    try:
        for rel in empty:
            os.makedirs(_inside_output(fresh, rel, path), exist_ok=True)
        for rel, content in files.items():
            file = _inside_output(fresh, rel, path)
            os.makedirs(os.path.dirname(file), exist_ok=True)
            kind = kinds.get(rel, {})
            kind = kind if isinstance(kind, dict) else {}
            if isinstance(content, bytes):
                with atomic_write(file) as handle:
                    handle.write(content)
            elif kind.get("kind") == "safetensors":
                write_safetensors(content, kind, file)
            else:
                write_torch(content, file)
        _swap_in(fresh, target)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise


def _inside_output(fresh: str, rel: Any, path: str) -> str:
    """Where the header's relative name ``rel`` goes under ``fresh``; a name that would reach
    outside it (absolute, empty parts, ``.`` or ``..``: the header is not trusted) is refused."""
    parts = rel.split("/") if isinstance(rel, str) else []
    if not parts or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        raise Error(f"{path}: refusing to write outside the output directory: {rel!r}")
    return os.path.join(fresh, *parts)


def _swap_in(fresh: str, target: str) -> None:
    """Put the finished directory ``fresh`` at ``target``: a rename where nothing is there;
    else the old one is renamed aside first and removed once the new one is in place."""
    old = None
    if os.path.exists(target):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-",
                               dir=os.path.dirname(target))
        os.rmdir(old)
        os.rename(target, old)
    try:
        os.rename(fresh, target)
    except BaseException:
        if old is not None:
            os.rename(old, target)  # the previous directory back where it was
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
