"""Real text present on every machine: the Python standard library's own source, as bytes."""

from __future__ import annotations

import functools
import sysconfig
from pathlib import Path

import torch

DEFAULT_MAX_BYTES = 8_000_000
_SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})


@functools.cache
def stdlib_files() -> tuple[Path, ...]:
    """The standard library's `*.py` files (installed packages excluded), in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [
        p for p in root.rglob("*.py") if p.is_file() and _SKIP_DIRS.isdisjoint(p.relative_to(root).parts)
    ]
    return tuple(sorted(files, key=lambda p: p.relative_to(root).as_posix()))


def load_corpus(max_bytes: int = DEFAULT_MAX_BYTES) -> torch.Tensor:
    """The first `max_bytes` bytes of the concatenated standard library, as int64 byte tokens."""
    chunks: list[bytes] = []
    size = 0
    for path in stdlib_files():
        if size >= max_bytes:
            break
        chunk = path.read_bytes()[: max_bytes - size]
        chunks.append(chunk)
        size += len(chunk)
    buf = bytearray(b"".join(chunks))
    return torch.frombuffer(buf, dtype=torch.uint8).to(torch.int64)


def split_corpus(data: torch.Tensor, val_fraction: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val): the last `val_fraction` of the tokens is the validation set."""
    n_train = int(len(data) * (1.0 - val_fraction))
    return data[:n_train], data[n_train:]


def get_batch(
    data: torch.Tensor, batch_size: int, block_size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows (x, y), y shifted by one token; drawn only from `generator`."""
    if len(data) <= block_size:
        raise ValueError(f"corpus of {len(data)} tokens is too short for block_size {block_size}")
    starts = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    index = starts[:, None] + torch.arange(block_size + 1)
    window = data[index]
    return window[:, :-1], window[:, 1:]
