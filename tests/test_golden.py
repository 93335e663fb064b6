"""Golden files: every committed .ckz of every format version must read back exactly."""

from __future__ import annotations

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
