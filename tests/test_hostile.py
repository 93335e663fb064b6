"""Headers a hostile author or bit rot would write, rebuilt with valid checksums so that the
checks under test are the ones reached: a base chain that loops (itself, two files, a hard
link), a delta read from a URL that names a local file as its base, a tree leaf index that is
no int, a view of more elements than an int64 counts. Each is a clean ckptzip error, quickly
and in bounded memory (a loop used to recurse until Python's limit, holding every level)."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptzip
from ckptzip.container import FLAG_DEFLATE, PRELUDE_SIZE, load_header, pack_prelude

from .test_bad_input import split


def rebuild(header: dict[str, Any], data: bytes) -> bytes:
    """``header`` and ``data`` as a file whose prelude and header checksum are valid."""
    raw = json.dumps(header).encode()
    return pack_prelude(raw) + raw + data


def delta_pair(tmp_path: Path) -> tuple[Path, Path]:
    first = {"w": torch.arange(4096, dtype=torch.float32)}
    second = {"w": first["w"] + 1}
    base, delta = tmp_path / "base.ckz", tmp_path / "delta.ckz"
    ckptzip.save(first, base)
    ckptzip.save(second, delta, base=base)
    return base, delta


def with_base(path: Path, location: str, base_id: Any = None) -> None:
    header, data = split(path.read_bytes())
    header["base"] = {"id": base_id, "path": location}
    path.write_bytes(rebuild(header, data))


def assert_loop_refused(path: Path) -> None:
    for attempt in (lambda: ckptzip.load(path), lambda: ckptzip.open(path).verify(),
                    lambda: ckptzip.open(path).get_tensor("w")):
        with pytest.raises(ckptzip.BaseMismatchError, match="the chain loops") as caught:
            attempt()
        assert len(str(caught.value)) < 2000, str(caught.value)[:300]
    run = subprocess.run([sys.executable, "-m", "ckptzip.cli", "-d", str(path), "-o",
                          str(path.with_suffix(".pt"))], capture_output=True, timeout=120)
    assert run.returncode == 1 and b"the chain loops" in run.stderr, run.stderr[-500:]
    assert b"Traceback" not in run.stderr


def test_a_delta_naming_itself_as_its_base_is_a_loop(tmp_path: Path) -> None:
    _, delta = delta_pair(tmp_path)
    with_base(delta, "delta.ckz")
    assert_loop_refused(delta)
    with_base(delta, str(delta.resolve()) + "/" * 0)  # an absolute name of itself
    assert_loop_refused(delta)


def test_two_deltas_naming_each_other_are_a_loop(tmp_path: Path) -> None:
    _, delta = delta_pair(tmp_path)
    other = tmp_path / "other.ckz"
    other.write_bytes(delta.read_bytes())
    with_base(delta, "other.ckz")
    with_base(other, "delta.ckz")
    assert_loop_refused(delta)


def test_a_hard_link_to_itself_is_a_loop(tmp_path: Path) -> None:
    _, delta = delta_pair(tmp_path)
    with_base(delta, "link.ckz")
    os.link(delta, tmp_path / "link.ckz")
    assert_loop_refused(delta)


def test_a_true_chain_still_loads(tmp_path: Path) -> None:
    _, delta = delta_pair(tmp_path)
    third = tmp_path / "third.ckz"
    ckptzip.save({"w": torch.arange(4096, dtype=torch.float32) + 2}, third, base=delta)
    assert torch.equal(ckptzip.load(third)["w"], torch.arange(4096, dtype=torch.float32) + 2)


def test_a_delta_read_from_a_url_never_opens_a_local_base(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    import fsspec

    base, delta = delta_pair(tmp_path)
    header, data = split(delta.read_bytes())
    header["base"]["path"] = str(base)  # a local file of the reader's, by absolute path
    url = "memory://ckptzip-hostile/delta.ckz"
    with fsspec.open(url, "wb") as out:
        out.write(rebuild(header, data))
    with pytest.raises(ckptzip.BaseMismatchError, match="names a local base"):
        ckptzip.load(url)
    second = ckptzip.load(url, base=base)  # given by the caller, it is trusted
    assert torch.equal(second["w"], torch.arange(4096, dtype=torch.float32) + 1)


@pytest.mark.parametrize("index", [[0], {"x": 1}, "0", 0.0])
def test_a_leaf_index_that_is_no_int_is_a_format_error(tmp_path: Path, index: Any) -> None:
    path = tmp_path / "a.ckz"
    ckptzip.save({"w": torch.ones(3)}, path)
    header, data = split(path.read_bytes())
    header["tree"]["o"]["w"]["i"] = index
    path.write_bytes(rebuild(header, data))
    for attempt in (lambda: ckptzip.load(path), lambda: ckptzip.open(path).verify()):
        with pytest.raises(ckptzip.FormatError, match="leaf index"):
            attempt()


@pytest.mark.parametrize(("shape", "stride"), [
    ([1 << 32, 1 << 32], [0, 0]),  # each dim below 2**63, their product not
    ([2] * 65, [0] * 65),  # more dims than a tensor may have
])
def test_a_view_past_int64_elements_is_a_format_error(tmp_path: Path, shape: list[int],
                                                      stride: list[int]) -> None:
    path = tmp_path / "a.ckz"
    ckptzip.save({"w": torch.ones(3)}, path)
    header, data = split(path.read_bytes())
    header["tree"]["o"]["v"] = {"t": "view", "i": 0, "offset": 0, "shape": shape, "stride": stride}
    path.write_bytes(rebuild(header, data))
    for attempt in (lambda: ckptzip.load(path), lambda: ckptzip.open(path).verify(),
                    lambda: ckptzip.open(path).get_tensor("v")):
        with pytest.raises(ckptzip.FormatError, match="bad view geometry"):
            attempt()


def test_rebuild_makes_files_that_load(tmp_path: Path) -> None:
    """The helper itself: a header rebuilt unchanged loads as the original."""
    path = tmp_path / "a.ckz"
    ckptzip.save({"w": torch.ones(3)}, path)
    header, data = split(path.read_bytes())
    again = rebuild(header, data)
    flags, length = struct.unpack_from("<IQ", again, 12)
    assert not flags & FLAG_DEFLATE
    assert json.loads(load_header(again[PRELUDE_SIZE:PRELUDE_SIZE + length], flags, "t")) == header
    assert torch.equal(ckptzip.loads(again)["w"], torch.ones(3))
