"""Damaged or hostile headers, and states a format cannot hold, met by the command line: each is
a ckptzip error that names the file and says what to do, never a traceback, and never a file
other than the one the command claims to write."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import ckptzip
from ckptzip.cli import main
from ckptzip.container import PRELUDE_SIZE, load_header, pack_prelude
from ckptzip.sources import write_directory


def split(blob: bytes) -> tuple[dict, bytes]:
    """A .ckz as its header (parsed) and the bytes after it."""
    flags, header_length = struct.unpack_from("<IQ", blob, 12)
    stored = blob[PRELUDE_SIZE : PRELUDE_SIZE + header_length]
    return json.loads(load_header(stored, flags, "<test>")), blob[PRELUDE_SIZE + header_length :]


def rewrite(path: Path, change: Any) -> None:
    """Rewrite the header of the .ckz at ``path`` with ``change(header)``, its checksum valid."""
    header, data = split(path.read_bytes())
    change(header)
    raw = json.dumps(header).encode()
    path.write_bytes(pack_prelude(raw) + raw + data)


TENSORS = {"a": torch.randn(4, 4, generator=torch.Generator().manual_seed(0)),
           "b": torch.arange(6, dtype=torch.int64)}


def entry(dtype: str, shape: Any, offsets: Any) -> dict[str, Any]:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


A, B = entry("F32", [4, 4], [0, 64]), entry("I64", [6], [64, 112])
DAMAGED_LAYOUTS = {
    "no data_offsets": json.dumps({"a": {"dtype": "F32", "shape": [4, 4]}, "b": B}),
    "no dtype": json.dumps({"a": {"shape": [4, 4], "data_offsets": [0, 64]}, "b": B}),
    "a JSON list": "[1, 2]",
    "a string entry": json.dumps({"a": "x", "b": "y"}),
    "an int offset": json.dumps({"a": entry("F32", [4, 4], 64), "b": B}),
    "overlapping offsets": json.dumps({"a": A, "b": entry("I64", [6], [0, 48])}),
    "an offset of 2**40": json.dumps({"a": A, "b": entry("I64", [6], [2**40, 2**40 + 48])}),
    "negative offsets": json.dumps({"a": A, "b": entry("I64", [6], [-48, 0])}),
    "a gap": json.dumps({"a": A, "b": entry("I64", [6], [72, 120])}),
    "data not from 0": json.dumps({"a": entry("F32", [4, 4], [8, 72]), "b": B}),
    "a wrong span": json.dumps({"a": entry("F32", [4, 4], [0, 60]), "b": entry("I64", [6], [60, 112])}),
    "a float shape": json.dumps({"a": entry("F32", [4.0, 4], [0, 64]), "b": B}),
    "bool offsets": json.dumps({"a": entry("F32", [4, 4], [False, 64]), "b": B}),
    "another dtype": json.dumps({"a": entry("I32", [4, 4], [0, 64]), "b": B}),
    "a missing tensor": json.dumps({"a": A}),
    "a key twice": f'{{"a": {json.dumps(A)}, "a": {json.dumps(A)}, "b": {json.dumps(B)}}}',
    "NaN": json.dumps({"__metadata__": {"x": float("nan")}, "a": A, "b": B}),
    "metadata not text": json.dumps({"__metadata__": {"x": 1}, "a": A, "b": B}),
    "not text": 5,
}


@pytest.fixture()
def packed_safetensors(tmp_path: Path) -> Path:
    save_file(TENSORS, str(tmp_path / "m.safetensors"))
    assert main(["compress", "-q", "-o", str(tmp_path / "m.ckz"), str(tmp_path / "m.safetensors")]) == 0
    return tmp_path / "m.ckz"


@pytest.mark.parametrize("damage", list(DAMAGED_LAYOUTS))
def test_a_damaged_safetensors_layout_is_refused_not_replayed(
        packed_safetensors: Path, damage: str, capsys) -> None:
    """decompress replayed the stored safetensors header unchecked: a traceback (KeyError,
    TypeError, AttributeError), or exit 0 with a file safetensors refuses (overlapping offsets)
    or a 1 TB sparse one (an offset of 2**40). The layout is now checked to tile the data
    exactly. Where it does not, plain decompress, whose output claims to be the original file
    byte for byte, fails and writes nothing (no silent fallback to another layout); --to
    safetensors, which claims only a safetensors file of the tensors, writes them in a fresh
    layout and says so."""
    layout = DAMAGED_LAYOUTS[damage]
    rewrite(packed_safetensors, lambda h: h["source"].update(header=layout))
    out = packed_safetensors.parent / "out.safetensors"
    capsys.readouterr()
    assert main(["-d", "-q", "-o", str(out), str(packed_safetensors)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ckptzip: error: {out}: cannot be restored byte for byte")
    assert "layout stored for it in the checkpoint is damaged" in err
    assert f"decompress {packed_safetensors} with --to safetensors" in err
    assert "--to pt" in err and len(err.splitlines()) == 1
    assert not out.exists()
    assert main(["-d", "--to", "safetensors", "-o", str(out), str(packed_safetensors)]) == 0
    assert "fresh layout" in capsys.readouterr().err
    back = load_file(str(out))
    assert back.keys() == TENSORS.keys() and all(torch.equal(back[k], TENSORS[k]) for k in TENSORS)


def test_every_dtype_safetensors_writes_comes_back_byte_for_byte(tmp_path: Path) -> None:
    """AMD's fp8 (F8_E4M3FNUZ, F8_E5M2FNUZ) was missing from the layout's dtypes: such a file
    came back in another layout; checked strictly, it would be called damaged."""
    raw = torch.randint(0, 256, (3, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "fnuz.safetensors"
    save_file({"e4": raw.view(torch.float8_e4m3fnuz), "e5": raw.clone().view(torch.float8_e5m2fnuz),
               "w": torch.zeros(0)}, str(path))
    original = path.read_bytes()
    assert main(["compress", "-q", "--rm", str(path)]) == 0
    assert main(["decompress", "-q", str(tmp_path / "fnuz.safetensors.ckz")]) == 0
    assert path.read_bytes() == original


def test_a_directory_restores_its_safetensors_files_whole_or_says_why(tmp_path: Path, capsys) -> None:
    """In a directory archive a damaged stored layout failed the same ways; now the directory
    is refused (nothing written), naming the file, as is a file whose kind the header garbles
    (it was written as a torch.save file under its .safetensors name)."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    save_file(TENSORS, str(folder / "model.safetensors"))
    (folder / "config.json").write_text("{}")
    packed = tmp_path / "ckpt.ckz"
    assert main(["compress", "-q", str(folder), "-o", str(packed)]) == 0
    pristine = packed.read_bytes()
    layout = DAMAGED_LAYOUTS["an offset of 2**40"]
    rewrite(packed, lambda h: h["source"]["files"]["model.safetensors"].update(header=layout))
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["-d", "-q", "-o", str(out), str(packed)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ckptzip: error: {out}/model.safetensors: cannot be restored byte for byte")
    assert "--to pt" in err and not out.exists()
    packed.write_bytes(pristine)
    rewrite(packed, lambda h: h["source"]["files"].update({"model.safetensors": "safetensors"}))
    assert main(["-d", "-q", "-o", str(out), str(packed)]) == 1
    err = capsys.readouterr().err
    assert f"{out}/model.safetensors: the checkpoint's header gives its kind as 'safetensors'" in err
    assert "damaged" in err and not out.exists()
    assert main(["-d", "-q", "--to", "pt", "-o", str(tmp_path / "all.pt"), str(packed)]) == 0


@pytest.mark.parametrize("name", ["a\x00b", "sub/x\x00", "\x00"])
def test_a_nul_in_a_directory_entry_is_a_damaged_header(tmp_path: Path, name: str) -> None:
    """A NUL in a file's or an empty directory's name passed the check for names that leave
    the output, and open() failed with "ValueError: embedded null byte", a traceback."""
    for files, empty in (({name: b"x"}, []), ({"ok.txt": b"x"}, [name])):
        with pytest.raises(ckptzip.FormatError, match=r"NUL character.*damaged.*--to pt"):
            write_directory({"files": files}, {"kind": "directory", "empty_dirs": empty},
                            str(tmp_path / "out"))
        assert list(tmp_path.iterdir()) == []


def test_tied_weights_to_safetensors_are_named_not_a_traceback(tmp_path: Path, capsys) -> None:
    """A torch.save state with tied weights (GPT-2's lm_head.weight is wte.weight) ended in
    safetensors' "Some tensors share memory" traceback. Safetensors cannot hold them without
    dropping a name, so it is refused naming both; --to pt keeps them shared."""
    weight = torch.randn(16, 8)
    torch.save({"wte.weight": weight, "lm_head.weight": weight, "bias": torch.ones(8)},
               tmp_path / "tied.pt")
    assert main(["compress", "-q", str(tmp_path / "tied.pt")]) == 0
    out = tmp_path / "tied.safetensors"
    assert main(["-d", "-q", "--to", "safetensors", str(tmp_path / "tied.pt.ckz")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"ckptzip: error: {out}: lm_head.weight and wte.weight share memory")
    assert "--to pt" in err and not out.exists()
    assert main(["-d", "-q", "--to", "pt", "-o", str(tmp_path / "back.pt"),
                 str(tmp_path / "tied.pt.ckz")]) == 0
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert back["wte.weight"] is back["lm_head.weight"] and torch.equal(back["wte.weight"], weight)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", [torch.complex128, torch.complex32, torch.bits16])
def test_a_dtype_safetensors_lacks_is_named(tmp_path: Path, dtype: torch.dtype, capsys) -> None:
    """complex128, complex32 and bits16 gave safetensors' KeyError as a traceback."""
    tensor = torch.zeros(4, dtype=torch.complex64).view(torch.int16).view(dtype)
    ckptzip.save({"w": torch.randn(4), "x": tensor}, tmp_path / "s.ckz")
    out = tmp_path / "s.safetensors"
    assert main(["-d", "-q", "--to", "safetensors", "-o", str(out), str(tmp_path / "s.ckz")]) == 1
    name = str(dtype).removeprefix("torch.")
    assert capsys.readouterr().err == (f"ckptzip: error: {out}: safetensors has no dtype for x "
                                       f"({name}); decompress with --to pt, which keeps every dtype\n")
    assert main(["-d", "-q", "--to", "pt", str(tmp_path / "s.ckz")]) == 0


@pytest.mark.parametrize("name", ["uint1", "uint7", "int1", "int7"])
def test_a_dtype_torch_save_lacks_is_named(tmp_path: Path, name: str, capsys) -> None:
    """A tensor of a sub-byte int dtype (a header may say uint1 to uint7, int1 to int7; load
    accepts them) gave torch.save's KeyError "dtype torch.uint1 is not recognized" as a
    traceback from -d --to pt; --to safetensors says that torch.save cannot store it either."""
    path = tmp_path / "s.ckz"
    ckptzip.save({"u": torch.arange(16, dtype=torch.uint8)}, path)

    def relabel(header: dict) -> None:
        (leaf,) = header["leaves"]
        leaf["dtype"] = name

    rewrite(path, relabel)
    out = tmp_path / "s.pt"
    assert main(["-d", "-q", "--to", "pt", "-o", str(out), str(path)]) == 1
    assert capsys.readouterr().err.startswith(
        f"ckptzip: error: {out}: torch.save has no storage type for u ({name}), so no torch.save "
        f"file can hold it; read the checkpoint in Python with ckptzip.load")
    assert not out.exists()
    assert main(["-d", "-q", "--to", "safetensors", str(path)]) == 1
    assert "torch.save cannot store it either" in capsys.readouterr().err


@pytest.mark.parametrize("version, shown", [(1, "1"), (1.0, "1.0"), ("1.0", '"1.0"'),
                                            (None, "null"), ([1, 0], "1.0")])
def test_inspect_prints_any_version_as_it_is(tmp_path: Path, version: Any, shown: str,
                                            capsys) -> None:
    """A header's "version" that is not a list (load accepts it) was a TypeError traceback in
    inspect ("'int' object is not iterable"); a string was printed a character at a time."""
    path = tmp_path / "v.ckz"
    ckptzip.save({"w": torch.randn(10)}, path)
    rewrite(path, lambda h: h.update(version=version))
    capsys.readouterr()
    assert main(["inspect", str(path)]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: ckz format {shown}, ")


def test_inspect_lists_a_delta_whose_base_is_unreadable(tmp_path: Path, capsys) -> None:
    """inspect of an intact delta whose base is damaged listed nothing and exited 1 naming only
    the base. Now the delta is listed and its chain shows the link as unreadable, with why,
    as it shows a missing base (exit status 0: inspect lists; verify is the check)."""
    weights = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    ckptzip.save({"w": weights}, tmp_path / "base.ckz")
    ckptzip.save({"w": weights + 1e-3}, tmp_path / "delta.ckz", base=tmp_path / "base.ckz")
    blob = (tmp_path / "base.ckz").read_bytes()
    for damaged, why in ((blob[:100], "truncated"), (b"hello world\n" * 10, "not a .ckz file")):
        (tmp_path / "base.ckz").write_bytes(damaged)
        capsys.readouterr()
        assert main(["inspect", str(tmp_path / "delta.ckz")]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert any(line.startswith("w ") for line in lines) and lines[-1].startswith("total")
        assert lines[1].startswith("base 1: base.ckz (id ") and f"): unreadable: {why}" in lines[1]
        assert main(["inspect", "--json", str(tmp_path / "delta.ckz")]) == 0
        (link,) = json.loads(capsys.readouterr().out)["chain"]
        assert link["path"] == "base.ckz" and link["status"].startswith(f"unreadable: {why}")
        assert main(["verify", str(tmp_path / "delta.ckz")]) == 1
