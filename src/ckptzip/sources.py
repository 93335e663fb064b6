"""Reading what users have (safetensors files, torch.save files, Hugging Face checkpoint
directories) into states, and writing states back out in those forms, for the command line.

A safetensors file keeps its original header in the ``.ckz`` so that decompressing it gives back
the same file, byte for byte. Directories keep every file: tensor files as states, the rest
(config.json, tokenizer files, trainer_state.json) as bytes.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from typing import Any

import torch

from .errors import Error, UnsupportedError
from .objstore import StorageOptions
from .storage import atomic_write, is_url

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

    with open(path, "rb") as handle:
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


def read_torch(path: str) -> Loaded:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types here; report them all the same way
        raise Error(
            f"{path}: cannot read with torch.load(weights_only=True): {str(exc).splitlines()[0]}; "
            f"ckptzip only reads files that load without running code"
        ) from None
    return Loaded(state, {"kind": "torch"})


def read_directory(path: str) -> Loaded:
    files: dict[str, Any] = {}
    kinds: dict[str, Any] = {}
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            loaded = read_file(full, inside_directory=True)
            files[rel] = loaded.state
            kinds[rel] = loaded.source
    if not files:
        raise Error(f"{path}: the directory holds no files to compress")
    return Loaded({"files": files}, {"kind": "directory", "files": kinds})


def read_file(path: str, *, inside_directory: bool = False) -> Loaded:
    lower = path.lower()
    if lower.endswith(SAFETENSORS_SUFFIXES):
        return read_safetensors(path)
    if lower.endswith(TORCH_SUFFIXES):
        return read_torch(path)
    if inside_directory:
        with open(path, "rb") as handle:
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
                      storage_options: StorageOptions = None) -> None:
    """Write tensors as safetensors; reproduce the original file exactly when its header is
    known and still describes these tensors."""
    tensors = flat_tensors(state, path)
    header_text = source.get("header") if source.get("kind") == "safetensors" else None
    if isinstance(header_text, str) and _write_original_layout(tensors, header_text, path,
                                                               storage_options):
        return
    from safetensors.torch import save

    meta = source.get("metadata") if isinstance(source.get("metadata"), dict) else None
    data = save({k: v.contiguous() for k, v in tensors.items()}, metadata=meta)
    with atomic_write(path, storage_options) as handle:
        handle.write(data)


_ST_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "C64": torch.complex64,
}


def _write_original_layout(tensors: dict[str, torch.Tensor], header_text: str, path: str,
                           storage_options: StorageOptions = None) -> bool:
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
        if (_ST_DTYPES.get(entry["dtype"]) != tensor.dtype or list(tensor.shape) != entry["shape"]
                or end - begin != tensor.numel() * tensor.element_size()):
            return False
        data_size = max(data_size, end)
    raw_header = header_text.encode("utf-8")
    with atomic_write(path, storage_options) as handle:
        handle.write(struct.pack("<Q", len(raw_header)) + raw_header)
        handle.truncate(8 + len(raw_header) + data_size)
        for name, entry in entries.items():
            handle.seek(8 + len(raw_header) + entry["data_offsets"][0])
            flat = tensors[name].contiguous().reshape(-1)
            handle.write(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return True


def write_torch(state: Any, path: str, storage_options: StorageOptions = None) -> None:
    with atomic_write(path, storage_options) as handle:
        torch.save(state, handle)


def write_directory(state: Any, source: dict[str, Any], path: str) -> None:
    files = state.get("files") if isinstance(state, dict) else None
    if not isinstance(files, dict):
        raise Error(f"{path}: this checkpoint was not compressed from a directory; use --to pt")
    if is_url(path):
        raise Error(f"{path}: a checkpoint directory is written to a local path only; pass "
                    f"-o DIR, or --to pt for one file")
    kinds = source.get("files", {})
    os.makedirs(path, exist_ok=True)
    for rel, content in files.items():
        target = os.path.join(path, *rel.split("/"))
        if os.path.isabs(rel) or ".." in rel.split("/"):
            raise Error(f"{path}: refusing to write outside the output directory: {rel!r}")
        os.makedirs(os.path.dirname(target), exist_ok=True)
        kind = kinds.get(rel, {})
        if isinstance(content, bytes):
            with atomic_write(target) as handle:
                handle.write(content)
        elif kind.get("kind") == "safetensors":
            write_safetensors(content, kind, target)
        else:
            write_torch(content, target)
