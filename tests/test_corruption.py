"""Corruption: every single-byte flip and every truncation of small files (lossless, delta, lossy)
and seeded random samples on a large one are either a ckptzip.Error or the exact original, never
silently wrong data and never a crash; broken, substituted and missing bases are refused by name.

The seed is printed; set ``CKPTZIP_CORRUPTION_SEED`` to replay another sample.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip.reader import CheckpointFile
from ckptzip.storage import BytesSource

from .reliability_counts import record

SEED = int(os.environ.get("CKPTZIP_CORRUPTION_SEED", "8008"))
LARGE_FLIPS = 2000
LARGE_TRUNCATIONS = 300
#: Words that tell the reader what to do; every message must hold one.
ADVICE = ("restore it from another copy", "re-copy", "re-save", "check the path", "pass",
          "put it back", "upgrade")


def bits_equal(a: Any, b: Any) -> bool:
    """Same structure, types and bits (NaNs and -0.0 included)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (a.dtype == b.dtype and a.shape == b.shape
                and torch.equal(a.contiguous().view(-1).view(torch.uint8),
                                b.contiguous().view(-1).view(torch.uint8)))
    if isinstance(a, dict):
        return list(a) == list(b) and all(bits_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(bits_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


@dataclass
class Tally:
    """Outcomes of damaged inputs: each is an error or the exact original."""

    name: str
    errors: int = 0
    exact: int = 0
    kinds: Counter[str] = field(default_factory=Counter)
    messages: list[str] = field(default_factory=list)

    def run(self, load: Callable[[], Any], expected: Any, what: str) -> None:
        try:
            out = load()
        except ckptzip.Error as exc:  # anything else (or a crash) fails the test outright
            self.errors += 1
            self.kinds[type(exc).__name__] += 1
            self.messages.append(str(exc))
            return
        assert bits_equal(out, expected), f"{self.name}: {what} loaded silently wrong data"
        self.exact += 1

    def check_messages(self, must_name: str) -> None:
        for message in self.messages:
            assert must_name in message, f"{self.name}: message does not name the file: {message}"
            assert any(word in message for word in ADVICE), f"{self.name}: no advice: {message}"

    def report(self, **extra: Any) -> None:
        record(self.name, seed=SEED, tried=self.errors + self.exact, errors=self.errors,
               exact=self.exact, silent=0, crashes=0, kinds=dict(self.kinds), **extra)


def flip(path: Path, position: int, mask: int) -> None:
    """XOR one byte of ``path`` in place (calling it twice restores the byte)."""
    fd = os.open(path, os.O_RDWR)
    try:
        byte = os.pread(fd, 1, position)[0]
        os.pwrite(fd, bytes([byte ^ mask]), position)
    finally:
        os.close(fd)


def exhaustive(path: Path, expected: Any, name: str, load: Callable[[], Any] | None = None) -> Tally:
    """Every single-byte flip (a different bit pattern at each position) and every truncation
    of the file at ``path``, loaded from disk."""
    load = load or (lambda: ckptzip.load(path, threads=1))
    original = path.read_bytes()
    tally = Tally(name)
    masks = [1 << bit for bit in range(8)] + [0xFF, 0x5A, 0x81]
    for position in range(len(original)):
        mask = masks[position % len(masks)]
        flip(path, position, mask)
        try:
            tally.run(load, expected, f"flip of byte {position} by {mask:#x}")
        finally:
            flip(path, position, mask)
    flips = tally.errors + tally.exact
    for cut in range(len(original)):
        path.write_bytes(original[:cut])
        tally.run(load, expected, f"truncation at {cut}")
    path.write_bytes(original)
    assert bits_equal(load(), expected)  # the undamaged file still loads: the test is sound
    tally.check_messages(path.name)
    tally.report(flips=flips, truncations=len(original), file_bytes=len(original))
    return tally


# -- a large file: random samples -----------------------------------------------------------------


def large_state() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(11)
    return {
        "model": {
            "w": torch.randn(400_000, generator=generator),  # 1.6 MB: 7 chunks of 256 KiB
            "bf": torch.randn(300_000, generator=generator).bfloat16(),
            "half": torch.randn(100_000, generator=generator).half(),
            "f64": torch.randn(40_000, generator=generator, dtype=torch.float64),
            "ids": torch.randint(0, 50_000, (100_000,), generator=generator),
            "mask": torch.rand(5_000, generator=generator) > 0.5,
            "zeros": torch.zeros(200_000, dtype=torch.int16),
        },
        "step": 1234,
        "name": "large",
        "lrs": [0.1, 0.01],
    }


def test_random_flips_and_truncations_of_a_large_file() -> None:
    state = large_state()
    blob = ckptzip.dumps(state, chunk_bytes=256 << 10, threads=1)
    with CheckpointFile(BytesSource(blob)) as ckpt:
        data_start = ckpt.data_start
        chunks = sum(len(leaf.chunks) for leaf in ckpt.leaves)
    assert len(blob) > 2_000_000 and chunks >= 12
    print(f"corruption seed {SEED}")
    rng = random.Random(SEED)
    tally = Tally("corruption.large")
    for i in range(LARGE_FLIPS):
        # one flip in five lands in the prelude and header, the rest anywhere
        position = rng.randrange(data_start) if i % 5 == 0 else rng.randrange(len(blob))
        mask = rng.randrange(1, 256)
        damaged = bytearray(blob)
        damaged[position] ^= mask
        tally.run(lambda damaged=damaged: ckptzip.loads(bytes(damaged), threads=1), state,
                  f"flip of byte {position} by {mask:#x} (seed {SEED})")
    flips = tally.errors + tally.exact
    cuts = sorted([*rng.sample(range(len(blob)), LARGE_TRUNCATIONS - 2), 0, len(blob) - 1])
    for cut in cuts:
        tally.run(lambda cut=cut: ckptzip.loads(blob[:cut], threads=1), state, f"truncation at {cut}")
    assert bits_equal(ckptzip.loads(blob, threads=1), state)
    assert tally.exact < flips // 100  # nearly every flip is caught, not passed over
    tally.check_messages("<bytes>")
    tally.report(flips=flips, truncations=len(cuts), file_bytes=len(blob), chunks=chunks)


# -- small files: exhaustive ----------------------------------------------------------------------


def small_pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """A base state and the next one, which differs a little (so it is coded as a delta)."""
    generator = torch.Generator().manual_seed(5)
    w = torch.randn(32, 32, generator=generator)
    base = {"w": w.bfloat16(), "b": torch.randn(64, generator=generator),
            "ids": torch.arange(40, dtype=torch.int32), "step": 1}
    new = {"w": (w + 0.01 * torch.randn(32, 32, generator=generator)).bfloat16(),
           "b": base["b"].clone(), "ids": base["ids"] + 1, "step": 2}
    return base, new


def test_every_flip_and_truncation_of_a_small_file_on_disk(tmp_path: Path) -> None:
    state = small_pair()[0]
    path = tmp_path / "small.ckz"
    ckptzip.save(state, path)
    tally = exhaustive(path, state, "corruption.small_lossless")
    assert tally.exact < (tally.errors + tally.exact) // 100


def test_every_flip_and_truncation_of_a_delta(tmp_path: Path) -> None:
    base, new = small_pair()
    ckptzip.save(base, tmp_path / "base.ckz")
    path = tmp_path / "delta.ckz"
    ckptzip.save(new, path, base=tmp_path / "base.ckz")
    with ckptzip.open(path) as ckpt:
        assert ckpt.base_ref is not None and all("base" in leaf.extra for leaf in ckpt.leaves)
    tally = exhaustive(path, new, "corruption.small_delta")
    assert tally.exact < (tally.errors + tally.exact) // 100


def test_every_flip_and_truncation_of_a_lossy_delta(tmp_path: Path) -> None:
    from .test_manager import training_state

    ckptzip.save(training_state(1), tmp_path / "base.ckz")
    path = tmp_path / "lossy.ckz"
    ckptzip.save(training_state(2), path, base=tmp_path / "base.ckz", mode="excp")
    with ckptzip.open(path) as ckpt:
        assert ckpt.mode == "excp"
    decoded = ckptzip.load(path)  # the lossy reconstruction: damage must give this or an error
    assert not bits_equal(decoded, training_state(2))
    exhaustive(path, decoded, "corruption.small_lossy")


def test_every_flip_of_a_base_is_caught_when_loading_its_delta(tmp_path: Path) -> None:
    base_state, new = small_pair()
    base = tmp_path / "base.ckz"
    ckptzip.save(base_state, base)
    delta = tmp_path / "delta.ckz"
    ckptzip.save(new, delta, base=base)
    tally = Tally("corruption.broken_base")
    masks = [1 << bit for bit in range(8)]
    size = base.stat().st_size
    for position in range(size):
        flip(base, position, masks[position % 8])
        try:
            tally.run(lambda: ckptzip.load(delta, threads=1), new, f"base flip at {position}")
        finally:
            flip(base, position, masks[position % 8])
    assert bits_equal(ckptzip.load(delta), new)
    tally.check_messages("base.ckz")
    assert tally.exact < size // 100
    tally.report(flips=size, file_bytes=size)


# -- bases: broken, substituted, missing, a middle link replaced ----------------------------------


def chain(tmp_path: Path) -> tuple[list[Path], list[dict[str, Any]]]:
    """a.ckz <- b.ckz <- c.ckz: each a delta on the one before."""
    generator = torch.Generator().manual_seed(9)
    w = torch.randn(4096, generator=generator)
    states = [{"w": w + 0.001 * i * torch.randn(4096, generator=generator), "step": i}
              for i in range(3)]
    paths = [tmp_path / f"{name}.ckz" for name in "abc"]
    for i, (state, path) in enumerate(zip(states, paths)):
        ckptzip.save(state, path, base=paths[i - 1] if i else None)
    with ckptzip.open(paths[2]) as last:
        assert last.chain_depth == 2
    return paths, states


def test_broken_base_is_refused_by_name(tmp_path: Path) -> None:
    (a, b, c), states = chain(tmp_path)
    with CheckpointFile.open(b) as ckpt:
        data_at = ckpt.data_start + ckpt.leaves[0].chunks[0].offset + 3
    flip(b, data_at, 0x10)  # a chunk of the middle link
    for path in (b, c):
        with pytest.raises(ckptzip.CorruptError, match=r"b\.ckz.*damaged.*restore") as info:
            ckptzip.load(path)
        assert "chunk" in str(info.value)
        assert str(info.value).startswith(f"{path}: ")  # names the file asked for, and b
    assert bits_equal(ckptzip.load(a), states[0])
    flip(b, data_at, 0x10)
    flip(b, 40, 0x01)  # the header of the middle link
    with pytest.raises(ckptzip.CorruptError, match=r"b\.ckz.*header checksum.*restore"):
        ckptzip.load(c)


def test_substituted_base_is_refused_by_name(tmp_path: Path) -> None:
    (a, b, c), states = chain(tmp_path)
    ckptzip.save({"w": torch.zeros(4096), "step": 1}, b)  # another valid checkpoint, same name
    with pytest.raises(ckptzip.BaseMismatchError,
                       match=r"c\.ckz: its base must have id \w+, but .*b\.ckz has id \w+: it is not "
                             r"the checkpoint this delta was coded against"):
        ckptzip.load(c)
    assert bits_equal(ckptzip.load(a), states[0])


def test_substituted_base_with_a_forged_id_is_caught_by_tensor_crcs(tmp_path: Path) -> None:
    """Even a base whose header claims the right id fails: each delta tensor records the CRC of
    the base tensor it was coded against."""
    from .test_bad_input import rebuild, split

    (_, b, c), _ = chain(tmp_path)
    with ckptzip.open(b) as ckpt:
        true_id = ckpt.id
    ckptzip.save({"w": torch.randn(4096), "step": 1}, b)
    header, data = split(b.read_bytes())
    header["id"] = true_id
    b.write_bytes(rebuild(header, data))
    with ckptzip.open(b) as forged:
        assert forged.id == true_id
    with pytest.raises(ckptzip.BaseMismatchError, match=r"c\.ckz.*tensor 'w'.*CRC mismatch.*pass"):
        ckptzip.load(c)


def test_missing_base_is_refused_by_name(tmp_path: Path) -> None:
    (_, b, c), _ = chain(tmp_path)
    os.remove(b)
    with pytest.raises(ckptzip.BaseMismatchError,
                       match=r"c\.ckz: its base 'b\.ckz' .* is missing.*put it back"):
        ckptzip.load(c)
    os.remove(c)
    with pytest.raises(ckptzip.Error, match=r"c\.ckz: no such file"):
        ckptzip.load(c)


def test_chain_with_the_middle_link_replaced(tmp_path: Path) -> None:
    """c -> b -> a, with b rewritten as a valid delta on the same a: c must refuse it."""
    (a, b, c), states = chain(tmp_path)
    saved_b = tmp_path / "saved-b.ckz"
    shutil.copy(b, saved_b)
    other = {"w": states[1]["w"] + 1e-3, "step": 1}
    ckptzip.save(other, b, base=a)
    assert bits_equal(ckptzip.load(b), other)  # b itself is a fine checkpoint now
    with pytest.raises(ckptzip.BaseMismatchError, match=r"c\.ckz.*b\.ckz.*not the checkpoint"):
        ckptzip.load(c)
    # and a replaced first link breaks the two deltas above it, naming the one that needs it
    shutil.copy(saved_b, b)
    ckptzip.save({"w": torch.ones(4096), "step": 0}, a)
    for path in (b, c):
        with pytest.raises(ckptzip.BaseMismatchError, match=r"b\.ckz: its base must have id") as info:
            ckptzip.load(path)
        assert str(info.value).startswith(f"{path}: ")
