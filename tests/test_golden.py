"""Golden files: every committed .ckz of every format version must read back exactly."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckptzip
from tests.golden.make_golden import EARLIER_WRITERS, golden_files, golden_state, plain_header

GOLDEN = sorted((Path(__file__).parent / "golden").glob("*.ckz"))


def assert_identical(expected: Any, actual: Any, path: str = "") -> None:
    assert type(actual) is type(expected), path
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, path
        assert torch.equal(actual.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)), path
    elif isinstance(expected, np.ndarray):
        assert actual.dtype == expected.dtype and np.array_equal(actual, expected), path
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), path
        for key in expected:
            assert_identical(expected[key], actual[key], f"{path}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), path
        for i, (e, a) in enumerate(zip(expected, actual)):
            assert_identical(e, a, f"{path}.{i}")
    else:
        assert actual == expected, path


def test_golden_files_exist() -> None:
    assert GOLDEN, "tests/golden/*.ckz are missing: run tests/golden/make_golden.py"


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name)
def test_golden_file_reads_back_exactly(path: Path) -> None:
    state = ckptzip.load(path)
    assert_identical(golden_state(), state)
    assert state["model"]["embed.weight"].data_ptr() == state["model"]["head.weight"].data_ptr()
    assert state["model"]._metadata == {"": {"version": 1}}
    with ckptzip.open(path) as ckpt:
        assert ckpt.metadata == {"golden": "v1.0"}
        assert ckpt.verify().tensors == len(ckpt.leaves)


def test_current_writer_round_trips_the_golden_state() -> None:
    assert_identical(golden_state(), ckptzip.loads(ckptzip.dumps(golden_state())))



def test_generator_writes_the_committed_files_byte_for_byte() -> None:
    """tests/golden/make_golden.py reproduces every committed golden file of today's writer, so
    each one has a known origin (a difference means the writer's output moved: add files, never
    rewrite); the earlier writers' files are all still there."""
    written = golden_files()
    assert sorted([*written, *EARLIER_WRITERS]) == [p.name for p in GOLDEN]
    for name, blob in written.items():
        assert blob == (GOLDEN[0].parent / name).read_bytes(), name


def test_earlier_writers_files_differ_from_todays_only_in_their_coding() -> None:
    """The plain-header file is the deflated one with its header re-stored (the form files had
    then), and today's writer codes the same state into another data section: the small
    segments' rANS layout (docs/STREAMS.md) is the only change."""
    here = GOLDEN[0].parent
    earlier = (here / "v1.0-lossless.ckz").read_bytes()
    assert plain_header(earlier) == (here / "v1.0-lossless-plain-header.ckz").read_bytes()
    assert len((here / "v1.0-lossless-small-rans.ckz").read_bytes()) < len(earlier)
    with ckptzip.open(here / "v1.0-lossless-small-rans.ckz") as now, \
            ckptzip.open(here / "v1.0-lossless.ckz") as then:
        assert [(leaf.shape, leaf.dtype) for leaf in now.leaves] == \
            [(leaf.shape, leaf.dtype) for leaf in then.leaves]


def test_the_header_level_moved_only_the_stored_header() -> None:
    """Session 30 deflates the header at level 6, not 9: the same JSON and the same data
    section, stored in a few more bytes."""
    from ckptzip.container import PRELUDE_SIZE, load_header

    def parts(blob: bytes) -> tuple[bytes, bytes, int]:
        flags, length = struct.unpack_from("<IQ", blob, 12)
        stored = blob[PRELUDE_SIZE : PRELUDE_SIZE + length]
        return load_header(stored, flags, "<golden>"), blob[PRELUDE_SIZE + length :], len(stored)

    here = GOLDEN[0].parent
    level9 = parts((here / "v1.0-lossless-small-rans.ckz").read_bytes())
    level6 = parts((here / "v1.0-lossless-header6.ckz").read_bytes())
    assert level6[:2] == level9[:2]
    assert level6[2] >= level9[2]


LOSSY_GOLDEN = sorted((Path(__file__).parent / "golden" / "lossy").glob("v1.0-*[!e].ckz"))


@pytest.mark.parametrize("path", [p for p in LOSSY_GOLDEN if not p.stem.endswith("-base")],
                         ids=lambda p: p.name)
def test_golden_lossy_file_decodes_to_the_bits_its_writer_decoded(path: Path) -> None:
    """Lossy files of every writer so far, the adaptive mode's marked weights included, decode to
    exactly what they decoded to when written."""
    from safetensors.torch import load_file

    expected = load_file(str(path.with_suffix(".expected.safetensors")))
    state = ckptzip.load(path)
    actual = {"layer.weight": state["model"]["layer.weight"],
              "exp_avg": state["optimizer"]["state"][0]["exp_avg"],
              "exp_avg_sq": state["optimizer"]["state"][0]["exp_avg_sq"]}
    assert sorted(actual) == sorted(expected)
    for name in expected:
        assert_identical(expected[name], actual[name], name)


# -- files of a newer ckptzip within format 1.0 (session 41's upgrade hunt) ------------------------


def _rewrite(path: Path, change: Any) -> None:
    """``path`` with ``change(header, data)`` applied, its checksums valid again (as a newer
    writer's file would be)."""
    from ckptzip.container import PRELUDE_SIZE, load_header, pack_prelude

    blob = path.read_bytes()
    flags, length = struct.unpack_from("<IQ", blob, 12)
    header = json.loads(load_header(blob[PRELUDE_SIZE:PRELUDE_SIZE + length], flags, "t"))
    data = bytearray(blob[PRELUDE_SIZE + length:])
    change(header, data)
    raw = json.dumps(header).encode()
    path.write_bytes(pack_prelude(raw) + raw + bytes(data))


def _newer_codec(header: dict, data: bytearray) -> None:
    header["pipelines"][header["leaves"][0]["pipeline"]] = [{"id": "a-codec-of-2030"}]


def _newer_node(header: dict, data: bytearray) -> None:
    header["tree"]["o"]["extra"] = {"t": "a-node-of-2030"}


def _newer_stream(header: dict, data: bytearray) -> None:
    from ckptzip import _native

    leaf = header["leaves"][0]
    length = leaf["chunks"][0][0]
    data[leaf["offset"]] = 0x7F  # a stream format byte no reader knows yet
    leaf["chunks"][0][1] = _native.crc32c(bytes(data[leaf["offset"]:leaf["offset"] + length]))


@pytest.mark.parametrize("change", [_newer_codec, _newer_node, _newer_stream],
                         ids=["codec", "tree node", "stream format"])
def test_what_a_newer_writer_adds_is_a_version_error_not_damage(tmp_path: Path, change: Any) -> None:
    """A codec, a tree node type or a stream format a newer ckptzip adds within format 1.0 asks
    for an upgrade (VersionError); a stream's unknown format byte under a checksum that holds
    said "the file is damaged; restore it from another copy" of a good checkpoint."""
    path = tmp_path / "new.ckz"
    ckptzip.save({"w": torch.linspace(-1, 1, 4096)}, path)
    _rewrite(path, change)
    with pytest.raises(ckptzip.VersionError, match="newer ckptzip") as caught:
        ckptzip.open(path).load()
    assert "damaged" not in str(caught.value)


@pytest.mark.parametrize("change", [_newer_codec, _newer_stream], ids=["codec", "stream format"])
def test_a_manager_never_drops_or_overwrites_what_a_newer_ckptzip_wrote(tmp_path: Path,
                                                                       change: Any) -> None:
    """Retention kept the bases of a .ckz a newer ckptzip wrote only for a newer format version:
    a file with a newer codec passed for damaged, depending on nothing, and its base was deleted.
    restore() fell back past a newer step file, which the next save replaced."""
    from ckptzip.manager import CheckpointManager, step_file

    def state(step: int) -> dict[str, Any]:  # a few elements change: deltas code against a base
        w = torch.linspace(-1, 1, 4096)
        w[::97] += step
        return {"w": w}

    with CheckpointManager(tmp_path, keep_last=1, keyframe_every=1) as manager:  # no chains
        manager.save(0, state(0))
        manager.wait()
        ckptzip.save(state(5), tmp_path / "best.ckz", base=tmp_path / step_file(0))
        with ckptzip.open(tmp_path / "best.ckz") as best:
            assert best.header.base is not None
        _rewrite(tmp_path / "best.ckz", change)
        for step in (10, 20):
            manager.save(step, state(step))
        manager.wait()
    assert (tmp_path / step_file(0)).exists()  # best.ckz may load from it with a newer ckptzip
    _rewrite(tmp_path / step_file(20), change)
    written = (tmp_path / step_file(20)).read_bytes()
    with CheckpointManager(tmp_path) as manager:
        with pytest.raises(ckptzip.VersionError, match="upgrade ckptzip"):
            manager.restore()
        assert torch.equal(manager.restore(0)["w"], state(0)["w"])  # asked for: it goes on
    assert (tmp_path / step_file(20)).read_bytes() == written
