"""Damaged and hostile files: every fault is a clear ckptzip.Error, never a crash, a hang, a huge
allocation or silently wrong data."""

from __future__ import annotations

import json
import os
import re
import struct
import zlib

import pytest
import torch

import ckptzip
from ckptzip import _native
from ckptzip.container import FLAG_DEFLATE, MAGIC, PRELUDE_SIZE, load_header, pack_prelude


def small_state() -> dict:
    torch.manual_seed(1)
    return {
        "w": torch.randn(64, 32).bfloat16(),
        "b": torch.randn(32),
        "ids": torch.arange(40, dtype=torch.int32),
        "step": 5,
        "name": "run",
    }


def assert_same(a, b) -> None:
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key].view(torch.uint8) if a[key].dtype == torch.bfloat16 else a[key],
                               b[key].view(torch.uint8) if b[key].dtype == torch.bfloat16 else b[key])
        else:
            assert a[key] == b[key]


def split(blob: bytes) -> tuple[dict, bytes]:
    (flags, header_length) = struct.unpack_from("<IQ", blob, 12)
    stored = blob[PRELUDE_SIZE : PRELUDE_SIZE + header_length]
    header = json.loads(load_header(stored, flags, "<test>"))
    return header, blob[PRELUDE_SIZE + header_length :]


def rebuild(header: dict, data: bytes) -> bytes:
    """A file with a *valid* prelude and header checksum around a tampered header."""
    raw = json.dumps(header).encode()
    return pack_prelude(raw) + raw + data


BLOB = ckptzip.dumps(small_state())


def test_every_truncation_is_detected() -> None:
    for cut in range(len(BLOB)):
        with pytest.raises(ckptzip.Error):
            ckptzip.loads(BLOB[:cut])


def test_trailing_bytes_are_detected() -> None:
    with pytest.raises(ckptzip.CorruptError, match="trailing"):
        ckptzip.loads(BLOB + b"\0")


def test_every_single_byte_flip_is_detected_or_harmless() -> None:
    original = small_state()
    harmless = 0
    for position in range(len(BLOB)):
        damaged = bytearray(BLOB)
        damaged[position] ^= 0x40
        try:
            out = ckptzip.loads(bytes(damaged))
        except ckptzip.Error:
            continue
        assert_same(original, out)  # never silently wrong
        harmless += 1
    assert harmless < len(BLOB) // 100


def test_wrong_magic_names_the_file(tmp_path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}" + b"\0" * 40)
    with pytest.raises(ckptzip.FormatError, match=r"model\.safetensors.*not a \.ckz") as info:
        ckptzip.load(path)
    assert "ckptzip compress" in str(info.value)


def test_newer_format_version_is_refused_clearly() -> None:
    blob = bytearray(BLOB)
    struct.pack_into("<H", blob, 8, 99)
    struct.pack_into("<I", blob, 28, _native.crc32c(bytes(blob[:28])))
    with pytest.raises(ckptzip.VersionError, match=r"format version 99.*upgrade"):
        ckptzip.loads(bytes(blob))


def test_header_length_beyond_the_file() -> None:
    blob = bytearray(BLOB)
    struct.pack_into("<Q", blob, 16, 2**60)
    struct.pack_into("<I", blob, 28, _native.crc32c(bytes(blob[:28])))
    with pytest.raises(ckptzip.TruncatedError):
        ckptzip.loads(bytes(blob))


@pytest.mark.parametrize(
    "tamper",
    [
        lambda h: h["leaves"][0].update(shape=[2**40, 2**40]),
        lambda h: h["leaves"][0].update(shape=[-1]),
        lambda h: h["leaves"][0].update(chunk=2**62),
        lambda h: h["leaves"][0].update(chunk=0),
        lambda h: h["leaves"][0]["chunks"][0].__setitem__(0, 2**62),
        lambda h: h["leaves"][0].update(offset=2**62),
        lambda h: h["leaves"][0].update(chunks=h["leaves"][0]["chunks"] * 1000),
        lambda h: h["leaves"][0].update(dtype="float128"),
        lambda h: h["leaves"][0].update(pipeline=[{"id": "nope"}]),
        lambda h: h["leaves"][0].update(pipeline=99),
        lambda h: h["pipelines"][0].__setitem__(0, {"id": "nope"}),
        lambda h: h["pipelines"][0].__setitem__(0, {"id": "byteplanes", "width": 3}),
        lambda h: h.update(pipelines={}),
        lambda h: h.update(chunk=0),
        lambda h: h.update(data_length=h["data_length"] + 10),
        lambda h: h.update(tree={"t": "tensor", "i": 99}),
        lambda h: h.update(tree={"t": "exec", "v": "import os"}),
        lambda h: h.update(leaves=None),
    ],
)
def test_absurd_or_malformed_headers_are_rejected(tamper) -> None:
    header, data = split(BLOB)
    tamper(header)
    with pytest.raises(ckptzip.FormatError):
        ckptzip.loads(rebuild(header, data))


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda c: c.__setitem__(0, [1, 2]), "chunk 0 entry must be [length, crc, raw_crc]"),
        (lambda c: c.__setitem__(0, {"length": 1}), "chunk 0 entry must be"),
        (lambda c: c[0].__setitem__(0, 0), "chunk 0 length is 0"),
        (lambda c: c[0].__setitem__(0, 2.0), "chunk 0 length is 2.0"),
        (lambda c: c[0].__setitem__(0, 2**40), "chunk 0 length is 1099511627776"),
        (lambda c: c[0].__setitem__(1, -1), "chunk 0 crc is -1"),
        (lambda c: c[0].__setitem__(1, 2**32), "chunk 0 crc is 4294967296"),
        (lambda c: c[0].__setitem__(1, True), "chunk 0 crc is True"),
        (lambda c: c[0].__setitem__(2, "0"), "chunk 0 raw crc is '0'"),
        (lambda c: c[-1].__setitem__(2, None), "raw crc is None"),
    ],
)
def test_bad_chunk_entries_are_named(tamper, message) -> None:
    """The header's chunk table is checked entry by entry; the error names the tensor, the
    chunk and what is wrong with it."""
    header, data = split(BLOB)
    tamper(header["leaves"][0]["chunks"])
    with pytest.raises(ckptzip.FormatError, match=re.escape(message)):
        ckptzip.loads(rebuild(header, data))


@pytest.mark.parametrize(
    ("shape", "message"),
    [([3, -1], "a shape dim is -1"), ([3, 1.5], "a shape dim is 1.5"),
     ([False], "a shape dim is False"), ("3", "shape must be a list")],
)
def test_bad_shapes_are_named(shape, message) -> None:
    header, data = split(BLOB)
    header["leaves"][0]["shape"] = shape
    with pytest.raises(ckptzip.FormatError, match=re.escape(message)):
        ckptzip.loads(rebuild(header, data))


@pytest.mark.parametrize("depth", [300, 100_000])
def test_deep_nesting_is_rejected(depth: int) -> None:
    header, data = split(BLOB)
    header["tree"] = "@TREE@"
    deep = '{"t":"list","v":[' * depth + "1" + "]}" * depth
    raw = json.dumps(header).replace('"@TREE@"', deep).encode()
    with pytest.raises(ckptzip.FormatError):
        ckptzip.loads(pack_prelude(raw) + raw + data)


def test_a_swapped_chunk_with_valid_crcs_still_fails_raw_check() -> None:
    """Chunks moved between tensors keep their stored CRC but cannot pass the raw-data CRC."""
    state = {"a": torch.randn(1000), "b": torch.randn(1000)}
    header, data = split(ckptzip.dumps(state))
    a, b = header["leaves"]
    a["chunks"][0][2], b["chunks"][0][2] = b["chunks"][0][2], a["chunks"][0][2]
    with pytest.raises(ckptzip.CorruptError, match="decoded bytes fail their checksum"):
        ckptzip.loads(rebuild(header, data))


def test_failed_save_leaves_previous_file_intact(tmp_path) -> None:
    path = tmp_path / "ckpt.ckz"
    ckptzip.save({"w": torch.ones(10)}, path)
    before = path.read_bytes()
    with pytest.raises(ckptzip.UnsupportedError, match=r"bad\.fn"):
        ckptzip.save({"w": torch.zeros(10), "bad": {"fn": print}}, path)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.ckz"]


def test_unsupported_values_name_their_key_path() -> None:
    with pytest.raises(ckptzip.UnsupportedError, match=r"optimizer\.state\.3\.fn"):
        ckptzip.dumps({"optimizer": {"state": {3: {"fn": lambda: 0}}}})
    with pytest.raises(ckptzip.UnsupportedError, match="to_dense"):
        ckptzip.dumps({"s": torch.eye(3).to_sparse()})
    with pytest.raises(ckptzip.UnsupportedError, match="quantized"):
        ckptzip.dumps({"q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)})


class Wrapper(torch.Tensor):
    """A tensor subclass whose data is not a storage of its own (as torchao's and DTensor are)."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor) -> Wrapper:
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)  # type: ignore[attr-defined,no-any-return]

    def __init__(self, inner: torch.Tensor) -> None:
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        raise NotImplementedError(func)


class Tagged(torch.Tensor):
    """A subclass over a plain storage: stored as a plain tensor."""


def test_tensor_subclasses_are_stored_when_they_are_one_storage_and_refused_otherwise() -> None:
    with pytest.raises(ckptzip.UnsupportedError, match=r"^model\.w: a tensor of subclass .*Wrapper"):
        ckptzip.dumps({"model": {"w": Wrapper(torch.ones(3))}})
    back = ckptzip.loads(ckptzip.dumps({"t": torch.arange(3.0).as_subclass(Tagged)}))
    assert type(back["t"]) is torch.Tensor and torch.equal(back["t"], torch.arange(3.0))


def test_unknown_mode_and_bad_threads() -> None:
    with pytest.raises(ckptzip.ConfigError, match="lossless"):
        ckptzip.dumps({}, mode="zip")
    with pytest.raises(ckptzip.ConfigError):
        ckptzip.dumps({}, threads=-1)


def test_magic_is_documented_value() -> None:
    assert BLOB.startswith(MAGIC) and MAGIC == b"\x89CKZ\r\n\x1a\n"


def test_headers_are_deflated_and_bounded() -> None:
    (flags,) = struct.unpack_from("<I", BLOB, 12)
    assert flags == FLAG_DEFLATE
    header, data = split(BLOB)
    bomb = zlib.compress(b"[" + b" " * 50_000_000 + b"]", 9)  # 50 MB of JSON from ~50 KB
    with pytest.raises(ckptzip.FormatError, match="inflates past"):
        ckptzip.loads(pack_prelude(bomb, FLAG_DEFLATE) + bomb + data)
    cut = zlib.compress(json.dumps(header).encode())[:-10]
    with pytest.raises(ckptzip.FormatError, match=r"cut short|does not inflate"):
        ckptzip.loads(pack_prelude(cut, FLAG_DEFLATE) + cut + data)
    trailing = zlib.compress(json.dumps(header).encode()) + b"junk"
    with pytest.raises(ckptzip.FormatError, match="padding"):
        ckptzip.loads(pack_prelude(trailing, FLAG_DEFLATE) + trailing + data)
    with pytest.raises(ckptzip.VersionError, match="flags"):
        raw = json.dumps(header).encode()
        ckptzip.loads(pack_prelude(raw, 0x80) + raw + data)


@pytest.mark.parametrize("tamper, message", [
    (lambda tree: {"t": "exec", "v": "os.system('x')"}, "unknown tree node type 'exec'"),
    (lambda tree: {"t": "tensor", "i": 9999}, "leaf index 9999 out of range"),
    (lambda tree: {"t": "view", "i": 0, "offset": 0, "shape": [10**6], "stride": [1]},
     "view reaches past its storage"),
])
def test_verify_checks_the_tree_a_load_builds(tmp_path, tamper, message) -> None:
    """verify said OK of a file whose every checksum holds around a tree a load refuses (an
    unknown node, a leaf index out of range): it now checks the tree too, nothing decoded."""
    header, data = split(BLOB)
    header["tree"] = tamper(header["tree"])
    (tmp_path / "bad.ckz").write_bytes(rebuild(header, data))
    with ckptzip.open(tmp_path / "bad.ckz") as checkpoint, pytest.raises(ckptzip.FormatError,
                                                                          match=re.escape(message)):
        checkpoint.verify()
    with pytest.raises(ckptzip.FormatError, match=re.escape(message)):
        ckptzip.load(tmp_path / "bad.ckz")
    (tmp_path / "ok.ckz").write_bytes(BLOB)
    with ckptzip.open(tmp_path / "ok.ckz") as good:
        assert good.verify().tensors == len(good.leaves)


@pytest.mark.parametrize("mode", ["lossless", "excp", "bitsnap", "adaptive"])
def test_chunk_bytes_must_be_an_int_a_reader_accepts(mode: str, tmp_path) -> None:
    """0 and negative sizes were clamped to one element a chunk, silently (session 39's hunt);
    more than 64 MiB saved a file that no load accepted (session 40's); 1 byte cost 1.2 KB of
    memory a byte."""
    for bad in (0, -5, 1, 4095, 1.5, "4096", (64 << 20) + 1, 128 << 20):
        with pytest.raises(ckptzip.ConfigError, match="chunk_bytes must be an int from 4096 "):
            ckptzip.save(small_state(), tmp_path / "a.ckz", mode=mode, chunk_bytes=bad)
    assert not (tmp_path / "a.ckz").exists()
    for good in (4096, 64 << 20):
        ckptzip.save(small_state(), tmp_path / "a.ckz", mode=mode, chunk_bytes=good)
        assert ckptzip.load(tmp_path / "a.ckz").keys() == small_state().keys()
