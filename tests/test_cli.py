"""The command line, end to end, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import ckptzip
from ckptzip.cli import main

from .s3server import SeaweedS3


@pytest.fixture()
def model_file(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "model.safetensors"
    save_file(
        {"emb.weight": torch.randn(300, 64).bfloat16(), "norm.bias": torch.zeros(64),
         "ids": torch.arange(12)},
        str(path),
        metadata={"format": "pt", "note": "kept"},
    )
    return path


def test_safetensors_round_trip_is_byte_identical(model_file: Path, tmp_path: Path) -> None:
    assert main(["compress", "-q", str(model_file)]) == 0
    packed = tmp_path / "model.safetensors.ckz"
    assert packed.exists()
    original = model_file.read_bytes()
    model_file.unlink()
    assert main(["decompress", "-q", str(packed)]) == 0
    assert model_file.read_bytes() == original


def test_safetensors_of_every_dtype_round_trip_byte_identical(tmp_path: Path) -> None:
    """Every dtype safetensors and torch share, F4 included (torch packs two of its elements a
    byte: the header's shape counts elements, the tensor's bytes), comes back byte for byte."""
    generator = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (6, 16), dtype=torch.uint8, generator=generator)
    tensors = {str(dtype).removeprefix("torch."): raw.clone().view(dtype) for dtype in (
        torch.float4_e2m1fn_x2, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu,
        torch.uint8, torch.int8, torch.bool)}
    tensors.update({str(dtype).removeprefix("torch."): raw.clone().view(dtype) for dtype in (
        torch.float16, torch.bfloat16, torch.int16, torch.uint16, torch.float32, torch.int32,
        torch.uint32, torch.float64, torch.int64, torch.uint64, torch.complex64)})
    tensors["bool"] = raw < 128
    path = tmp_path / "every.safetensors"
    save_file(tensors, str(path))
    original = path.read_bytes()
    assert main(["compress", "-q", "--rm", str(path)]) == 0
    assert main(["decompress", "-q", str(tmp_path / "every.safetensors.ckz")]) == 0
    assert path.read_bytes() == original


def test_decompress_refuses_to_overwrite_without_force(model_file: Path, capsys) -> None:
    main(["compress", "-q", str(model_file)])
    assert main(["decompress", "-q", str(model_file) + ".ckz"]) == 1
    assert "-f to overwrite" in capsys.readouterr().err
    assert main(["decompress", "-q", "-f", str(model_file) + ".ckz"]) == 0


def test_torch_file_and_format_conversion(tmp_path: Path) -> None:
    state = {"model": {"w": torch.randn(10, 3)}, "step": 4}
    src = tmp_path / "ckpt.pt"
    torch.save(state, src)
    assert main(["-q", str(src)]) == 0  # zstd habit: a bare FILE compresses
    out = tmp_path / "restored.pt"
    assert main(["-d", "-q", str(src) + ".ckz", "-o", str(out)]) == 0
    restored = torch.load(out, weights_only=True)
    assert torch.equal(restored["model"]["w"], state["model"]["w"]) and restored["step"] == 4
    assert main(["decompress", "-q", str(src) + ".ckz", "--to", "safetensors",
                 "-o", str(tmp_path / "flat.safetensors")]) == 1  # "step" is not a tensor


def test_hf_style_directory_round_trip(tmp_path: Path, model_file: Path) -> None:
    ckpt = tmp_path / "checkpoint-10"
    ckpt.mkdir()
    model_file.rename(ckpt / "model.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.randn(5)}}, "param_groups": [{"lr": 0.1, "params": [0]}]},
               ckpt / "optimizer.pt")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 10}))
    (ckpt / "sub").mkdir()
    (ckpt / "sub" / "notes.txt").write_bytes(b"\x00binary\xff")
    assert main(["compress", "-q", str(ckpt)]) == 0
    restored = tmp_path / "restored"
    assert main(["decompress", "-q", str(tmp_path / "checkpoint-10.ckz"), "-o", str(restored)]) == 0
    for name in ("model.safetensors", "trainer_state.json", "sub/notes.txt"):
        assert (restored / name).read_bytes() == (ckpt / name).read_bytes(), name
    opt = torch.load(restored / "optimizer.pt", weights_only=True)
    assert torch.equal(opt["state"][0]["exp_avg"],
                       torch.load(ckpt / "optimizer.pt", weights_only=True)["state"][0]["exp_avg"])


def test_inspect_and_json(model_file: Path, capsys) -> None:
    main(["compress", "-q", str(model_file)])
    capsys.readouterr()
    assert main(["inspect", str(model_file) + ".ckz"]) == 0
    text = capsys.readouterr().out
    assert "emb.weight" in text and "bfloat16" in text and "300x64" in text and "total" in text
    assert main(["-l", "--json", str(model_file) + ".ckz"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tensors"] == 3 and info["source"] == "safetensors"
    by_name = {leaf["name"]: leaf for leaf in info["leaves"]}
    assert by_name["emb.weight"]["codec"].startswith("byteplanes(2,1)+entropy")
    assert by_name["norm.bias"]["ratio"] > 1


def test_verify_exit_status(model_file: Path, tmp_path: Path, capsys) -> None:
    main(["compress", "-q", str(model_file)])
    packed = Path(str(model_file) + ".ckz")
    assert main(["verify", str(packed)]) == 0
    assert "OK" in capsys.readouterr().err
    data = bytearray(packed.read_bytes())
    data[-10] ^= 1
    damaged = tmp_path / "damaged.ckz"
    damaged.write_bytes(bytes(data))
    assert main(["-t", str(packed), str(damaged)]) == 1
    err = capsys.readouterr().err
    assert "damaged.ckz" in err and "damaged" in err


def test_errors_are_one_clear_line(tmp_path: Path, capsys) -> None:
    assert main(["compress", str(tmp_path / "missing.pt")]) == 1
    assert "missing.pt: no such file" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["compress", str(tmp_path / "notes.txt")]) == 1
    assert "unknown input" in capsys.readouterr().err


def test_help_teaches() -> None:
    result = subprocess.run([sys.executable, "-m", "ckptzip.cli", "--help"], capture_output=True,
                            text=True, check=True)
    for word in ("compress", "decompress", "inspect", "verify", "bench", "demo", "examples"):
        assert word in result.stdout
    result = subprocess.run([sys.executable, "-m", "ckptzip.cli", "compress", "--help"],
                            capture_output=True, text=True, check=True)
    assert "-T N" in result.stdout and "--force" in result.stdout


def test_console_script_version() -> None:
    result = subprocess.run([sys.executable, "-m", "ckptzip.cli", "-V"], capture_output=True, text=True)
    assert result.stdout.strip() == f"ckptzip {ckptzip.__version__}"


def test_delta_chain_from_the_command_line(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    weights = torch.randn(200, 100)
    paths = []
    for step in range(3):
        weights = weights + 1e-4 * torch.randn_like(weights)
        path = tmp_path / f"step-{step}.pt"
        torch.save({"w": weights.clone(), "step": step}, path)
        args = ["compress", "-q", str(path)]
        if paths:
            args += ["--base", str(paths[-1]) + ".ckz"]
        assert main(args) == 0
        paths.append(path)
    last = str(paths[-1]) + ".ckz"
    capsys.readouterr()
    assert main(["inspect", last]) == 0
    text = capsys.readouterr().out
    assert "base 1: step-1.pt.ckz" in text and "base 2: step-0.pt.ckz" in text and "residual" in text
    delta_size = Path(last).stat().st_size
    assert main(["flatten", "-q", last, "-o", str(tmp_path / "flat.ckz")]) == 0
    assert Path(tmp_path / "flat.ckz").stat().st_size > delta_size
    for candidate in (last, str(tmp_path / "flat.ckz")):
        out = tmp_path / "out.pt"
        assert main(["decompress", "-q", "-f", candidate, "-o", str(out)]) == 0
        assert torch.equal(torch.load(out, weights_only=True)["w"], weights)
    (tmp_path / "step-0.pt.ckz").unlink()
    assert main(["verify", last]) == 1
    assert "missing" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "flat.ckz")]) == 0


def test_bench_compares_with_peers_on_the_same_bytes(model_file: Path, capsys) -> None:
    assert main(["bench", "-q", "--repeat", "1", str(model_file)]) == 0
    table = capsys.readouterr().out
    assert "ckptzip" in table and "zstd-1" in table and "ratio" in table.lower()


def test_adaptive_error_budget_from_the_command_line(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    weights = torch.randn(300, 200)
    paths = []
    for step in range(2):
        weights = weights + 1e-3 * torch.randn_like(weights)
        path = tmp_path / f"step-{step}.pt"
        torch.save({"model": {"w": weights.clone()}, "step": step}, path)
        paths.append(path)
    assert main(["compress", "-q", "--mode", "adaptive", str(paths[0])]) == 0
    sizes = {}
    for budget in ("0.05", "weight=0.5"):
        out = tmp_path / f"delta-{budget}.ckz"
        assert main(["compress", "-q", "-f", "--mode", "adaptive", "--error-budget", budget,
                     "--base", str(paths[0]) + ".ckz", str(paths[1]), "-o", str(out)]) == 0
        sizes[budget] = out.stat().st_size
        with ckptzip.open(out) as checkpoint:
            error = next(leaf.extra["error"] for leaf in checkpoint.leaves if leaf.name == "model.w")
        assert error["budget"] == float(budget.split("=")[-1])
    assert sizes["weight=0.5"] < sizes["0.05"]
    capsys.readouterr()
    assert main(["compress", "-q", "--error-budget", "0.3", str(paths[1]), "-o",
                 str(tmp_path / "x.ckz")]) == 1
    assert "--error-budget applies to --mode adaptive" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["compress", "--mode", "adaptive", "--error-budget", "weight:0.3", str(paths[1])])
    assert exit_info.value.code == 2
    assert "state=number pairs" in capsys.readouterr().err


def test_verbose_shows_each_tensor(tmp_path: Path, model_file: Path, capsys) -> None:
    """``-v`` prints a line per tensor on compress, decompress, verify and inspect (chunks); a
    lossy tensor's line carries its recorded error. Without it, none."""
    packed = str(model_file) + ".ckz"
    assert main(["compress", str(model_file)]) == 0
    assert "emb.weight" not in capsys.readouterr().err
    for command in (["compress", "-v", "-f", str(model_file)], ["decompress", "-v", "-f", packed],
                    ["verify", "-v", packed]):
        assert main(command) == 0
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  ")]
        by_name = {line.split(":")[0].strip(): line for line in lines}
        assert sorted(by_name) == ["emb.weight", "ids", "norm.bias"]
        emb = by_name["emb.weight"]
        assert "bfloat16 300x64, 38,400 -> " in emb and "byteplanes(2,1)+entropy" in emb
        assert "x)" in emb and "error" not in emb
    assert main(["inspect", "-v", packed]) == 0
    assert "chunks" in capsys.readouterr().out.splitlines()[1]

    weights = torch.randn(300, 200)
    torch.save({"model": {"w": weights}}, tmp_path / "a.pt")
    torch.save({"model": {"w": weights + 1e-3 * torch.randn_like(weights)}}, tmp_path / "b.pt")
    assert main(["compress", "-q", str(tmp_path / "a.pt")]) == 0
    assert main(["compress", "-v", "--mode", "adaptive", "--base", str(tmp_path / "a.pt.ckz"),
                 str(tmp_path / "b.pt")]) == 0
    line = next(line for line in capsys.readouterr().err.splitlines() if "model.w:" in line)
    assert "float32 300x200, 240,000 -> " in line and ", error mse=" in line and "rel=" in line


def test_the_command_tunes_malloc_for_its_own_process(tmp_path, monkeypatch) -> None:
    """ckptzip's command line sets glibc's malloc to keep what it frees (ckptzip.allocator),
    unless CKPTZIP_MALLOC=system; the library leaves a user's process alone."""
    import ckptzip.cli as cli

    calls: list[int] = []
    monkeypatch.setattr(cli, "tune_malloc", lambda: calls.append(1) or True)
    path = tmp_path / "a.ckz"
    ckptzip.save({"w": torch.zeros(4)}, path)
    monkeypatch.delenv("CKPTZIP_MALLOC", raising=False)
    assert main(["inspect", str(path)]) == 0 and calls == [1]
    monkeypatch.setenv("CKPTZIP_MALLOC", "system")
    assert main(["inspect", str(path)]) == 0 and calls == [1]
    ckptzip.save({"w": torch.ones(4)}, tmp_path / "b.ckz", mode="adaptive", base=path)
    assert calls == [1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tune_malloc_sets_glibc_and_the_process_still_works() -> None:
    """In a process of its own (it is process-wide): mallopt accepts every setting, and a lossy
    save and load run as before."""
    script = (
        "import ckptzip, torch, platform\n"
        "tuned = ckptzip.tune_malloc()\n"
        "assert tuned == (platform.libc_ver()[0] == 'glibc'), tuned\n"
        "state = {'w': torch.randn(256, 256)}\n"
        "base = ckptzip.dumps(state)\n"
        "state['w'] += 1e-3 * torch.randn(256, 256)\n"
        "out = ckptzip.loads(ckptzip.dumps(state, mode='adaptive', base=base), base=base)\n"
        "assert (out['w'] - state['w']).norm() < 1e-3 * 256\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


# What a user hunt found the command line doing to their files (session 39); each lost data
# or failed with a traceback before its fix.


def _save(path: Path, value: float = 1.0) -> None:
    torch.save({"w": torch.full((100,), value)}, path)


def test_outputs_never_land_on_their_inputs(tmp_path: Path, monkeypatch, capsys) -> None:
    """-o over SRC, over --base, inside a SRC directory, or with several SRCs is refused, and
    nothing is removed; ``compress --rm .`` writes beside the directory, not into it."""
    _save(tmp_path / "a.pt")
    _save(tmp_path / "b.pt", 2.0)
    refusals = [
        (["compress", "-f", "--rm", "-o", str(tmp_path / "a.pt"), str(tmp_path / "a.pt")],
         "would overwrite its input"),
        (["compress", "-f", "--rm", "-o", str(tmp_path / "x.ckz"), str(tmp_path / "a.pt"),
          str(tmp_path / "b.pt")], "-o takes one SRC only"),
    ]
    for argv, message in refusals:
        assert main(["-q", *argv] if argv[0] == "-q" else argv) == 1
        assert message in capsys.readouterr().err
    assert (tmp_path / "a.pt").exists() and (tmp_path / "b.pt").exists()
    assert main(["compress", "-q", str(tmp_path / "a.pt")]) == 0
    _save(tmp_path / "a.pt", 3.0)
    base = str(tmp_path / "a.pt.ckz")
    assert main(["compress", "-q", "-f", "--rm", "--base", base, "-o", base,
                 str(tmp_path / "a.pt")]) == 1
    assert "is the --base" in capsys.readouterr().err
    assert torch.equal(ckptzip.load(base)["w"], torch.full((100,), 1.0))

    directory = tmp_path / "run"
    directory.mkdir()
    _save(directory / "model.pt")
    assert main(["compress", "-q", "--rm", "-o", str(directory / "run.ckz"), str(directory)]) == 1
    assert "inside the directory" in capsys.readouterr().err and (directory / "model.pt").exists()
    monkeypatch.chdir(directory)
    assert main(["compress", "-q", "--rm", "."]) == 0
    assert not directory.exists()
    assert torch.equal(ckptzip.load(tmp_path / "run.ckz")["files"]["model.pt"]["w"],
                       torch.full((100,), 1.0))


def test_decompressed_names_keep_their_dotted_parts(tmp_path: Path) -> None:
    """Files saved from Python as run.step1.ckz and run.step2.ckz both became run.pt (the
    second overwrote the first under -f)."""
    for step in (1, 2):
        ckptzip.save({"w": torch.full((3,), float(step))}, tmp_path / f"run.step{step}.ckz")
    ckptzip.save({"w": torch.zeros(3)}, tmp_path / "model.pt.ckz")
    assert main(["decompress", "-q", "-f", "--rm", str(tmp_path / "run.step1.ckz"),
                 str(tmp_path / "run.step2.ckz"), str(tmp_path / "model.pt.ckz")]) == 0
    for step in (1, 2):
        assert torch.load(tmp_path / f"run.step{step}.pt")["w"][0] == step
    assert (tmp_path / "model.pt").exists()


def test_flatten_in_place_keeps_the_deltas_that_need_it(tmp_path: Path, capsys) -> None:
    """Flattened in place, a delta gets another id: the deltas coded against it would never
    load again. It is refused (naming them) unless -o or -f; -o refuses an existing file."""
    paths = [str(tmp_path / f"step-{k}.ckz") for k in range(3)]
    weights = [torch.randn(4096, generator=torch.Generator().manual_seed(0))]
    for k, path in enumerate(paths):
        if k:
            weights.append(weights[-1].clone())
            weights[-1][:10] += 1.0  # a delta that codes against its base
        ckptzip.save({"w": weights[k]}, path, base=paths[k - 1] if k else None)
    assert ckptzip.open(paths[2]).chain_depth == 2
    assert main(["flatten", "-q", paths[1]]) == 1
    assert "step-2.ckz" in capsys.readouterr().err
    assert torch.equal(ckptzip.load(paths[2])["w"], weights[2])
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["flatten", "-q", "-o", str(tmp_path / "notes.txt"), paths[1]]) == 1
    assert (tmp_path / "notes.txt").read_text() == "mine"
    # a file of the chain it reads, even with -f: every link after it would lose its base
    written = [Path(path).read_bytes() for path in paths]
    assert main(["flatten", "-q", "-f", "-o", paths[0], paths[2]]) == 1
    assert "link of the base chain" in capsys.readouterr().err
    torch.save({"w": weights[2]}, tmp_path / "next.pt")
    for link in paths[:2]:
        assert main(["compress", "-q", "-f", "--base", paths[2], "-o", link,
                     str(tmp_path / "next.pt")]) == 1
        assert "without its base" in capsys.readouterr().err
    assert [Path(path).read_bytes() for path in paths] == written
    assert main(["flatten", "-q", paths[2]]) == 0  # nothing depends on the last one
    assert ckptzip.open(paths[2]).chain_depth == 0


def test_several_sources_each_get_their_turn(tmp_path: Path, capsys) -> None:
    """As zstd: a SRC that fails is reported, the others still run, the exit status is 1."""
    _save(tmp_path / "a.pt")
    (tmp_path / "bad.pt").write_bytes(b"")
    _save(tmp_path / "c.pt")
    assert main(["compress", "-q", str(tmp_path / "a.pt"), str(tmp_path / "bad.pt"),
                 str(tmp_path / "c.pt")]) == 1
    err = capsys.readouterr().err
    assert "bad.pt: cannot read with torch.load" in err and "Traceback" not in err
    assert (tmp_path / "a.pt.ckz").exists() and (tmp_path / "c.pt.ckz").exists()
    assert main(["inspect", str(tmp_path / "missing.ckz"), str(tmp_path / "c.pt.ckz")]) == 1
    assert "c.pt.ckz: ckz format" in capsys.readouterr().out


def test_directories_keep_linked_and_empty_directories(tmp_path: Path, capsys) -> None:
    """A linked subdirectory was skipped by the walk (its files silently left out) and empty
    directories were dropped: both come back now, as plain directories. A link that loops back
    to a directory holding it is refused, naming it."""
    source, elsewhere = tmp_path / "run", tmp_path / "elsewhere" / "inner"
    (source / "real").mkdir(parents=True)
    (source / "logs" / "empty").mkdir(parents=True)
    elsewhere.mkdir(parents=True)
    (elsewhere / "notes.txt").write_text("kept")
    _save(source / "real" / "model.pt")
    (source / "shared").symlink_to(elsewhere)
    assert main(["compress", "-q", str(source), "-o", str(tmp_path / "run.ckz")]) == 0
    assert main(["decompress", "-q", str(tmp_path / "run.ckz"), "-o", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert (out / "shared" / "notes.txt").read_text() == "kept"
    assert not (out / "shared").is_symlink()
    assert (out / "logs" / "empty").is_dir() and not any((out / "logs" / "empty").iterdir())
    assert torch.equal(torch.load(out / "real" / "model.pt")["w"], torch.full((100,), 1.0))
    (source / "real" / "loop").symlink_to(source)
    assert main(["compress", "-q", "-f", str(source), "-o", str(tmp_path / "run.ckz")]) == 1
    assert "loop: a link to a directory that holds it" in capsys.readouterr().err


@pytest.mark.parametrize("files, empty", [
    ({"../evil.txt": b"x"}, []), ({"/tmp/evil.txt": b"x"}, []), ({"a//b": b"x"}, []),
    ({"ok.txt": b"x"}, ["../evil"]), ({"ok.txt": b"x"}, ["sub/./x"]), ({"ok.txt": b"x"}, "sub")])
def test_a_directory_header_never_writes_outside_its_output(tmp_path: Path, files, empty) -> None:
    """The header's file and directory names are not trusted: a name that would reach outside
    the output directory is refused, and nothing is left behind, not even the new directory."""
    from ckptzip.sources import write_directory

    with pytest.raises(ckptzip.Error, match=r"refusing to write outside|damaged"):
        write_directory({"files": files}, {"kind": "directory", "empty_dirs": empty},
                        str(tmp_path / "out" / "run"))
    out = tmp_path / "out"
    assert (list(out.iterdir()) if out.exists() else []) == []
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out" / "evil").exists()


class TrainingArguments:
    """What pickle stores and loading with weights_only refuses, as a Trainer's
    training_args.bin."""


def test_directories_keep_what_torch_cannot_load_safely_and_decompress_whole(
        tmp_path: Path, capsys) -> None:
    """A Trainer directory's training_args.bin (a pickled object) is kept as bytes, not a
    refusal; a link to a file is stored as the file; decompress -f replaces the directory
    whole, and a failure leaves the old one as it was."""
    directory = tmp_path / "checkpoint-2"
    directory.mkdir()
    _save(directory / "optimizer.pt")

    torch.save(TrainingArguments(), directory / "training_args.bin")
    (tmp_path / "blob").write_text('{"a": 1}')
    (directory / "config.json").symlink_to(tmp_path / "blob")
    assert main(["compress", "-q", str(directory)]) == 0
    old = (directory / "training_args.bin").read_bytes()
    (directory / "stale.txt").write_text("from before")
    assert main(["decompress", "-q", "-f", str(tmp_path / "checkpoint-2.ckz")]) == 0
    assert (directory / "training_args.bin").read_bytes() == old
    assert (directory / "config.json").read_text() == '{"a": 1}'
    assert not (directory / "config.json").is_symlink() and not (directory / "stale.txt").exists()
    (directory / "dangling").symlink_to(tmp_path / "nothing")
    assert main(["compress", "-q", "-f", str(directory)]) == 1
    assert "a link to nothing" in capsys.readouterr().err


def test_sigterm_removes_the_temporary_file(tmp_path: Path) -> None:
    """SIGTERM (timeout, docker stop, a scheduler's preemption) mid-write cleans up as Ctrl-C
    does: no temporary file, no output, exit status 143."""
    save_file({f"l{i}": torch.randn(1024, 1024) for i in range(8)}, str(tmp_path / "big.safetensors"))
    process = subprocess.Popen([sys.executable, "-m", "ckptzip.cli", "compress", "-q", "-T", "1",
                                str(tmp_path / "big.safetensors")], stderr=subprocess.PIPE)
    for _ in range(4000):
        if any(".ckz-tmp-" in p.name for p in tmp_path.iterdir()) or process.poll() is not None:
            break
        import time

        time.sleep(0.002)
    process.terminate()
    assert process.wait(60) in (143, 0)  # 0: it had finished first (a fast machine)
    assert not any(".ckz-tmp-" in p.name for p in tmp_path.iterdir())


def test_a_closed_pipe_is_no_traceback(tmp_path: Path) -> None:
    ckptzip.save({f"t{i}": torch.zeros(4) for i in range(3000)}, tmp_path / "many.ckz")
    run = subprocess.run(f"{sys.executable} -m ckptzip.cli inspect {tmp_path / 'many.ckz'} | head -1",
                         shell=True, capture_output=True, text=True, timeout=120)
    assert "many.ckz: ckz format" in run.stdout and "Traceback" not in run.stderr


def test_outputs_keep_their_inputs_permissions(tmp_path: Path) -> None:
    """A private checkpoint stays private: compress and decompress keep SRC's permission bits,
    as gzip and zstd do (they were 0644 whatever SRC's)."""
    _save(tmp_path / "secret.pt")
    (tmp_path / "secret.pt").chmod(0o600)
    assert main(["compress", "-q", str(tmp_path / "secret.pt")]) == 0
    assert (tmp_path / "secret.pt.ckz").stat().st_mode & 0o777 == 0o600
    assert main(["decompress", "-q", "-o", str(tmp_path / "back.pt"),
                 str(tmp_path / "secret.pt.ckz")]) == 0
    assert (tmp_path / "back.pt").stat().st_mode & 0o777 == 0o600


# What a hunt through chains of deltas found the command line doing to them (session 40); each
# failed before its fix.


def _chain(paths: list[str], options: dict | None = None) -> list[torch.Tensor]:
    """A chain of deltas at ``paths``, each coded against the one before; the weights saved."""
    weights = [torch.randn(4096, generator=torch.Generator().manual_seed(0))]
    for k, path in enumerate(paths):
        if k:
            weights.append(weights[-1].clone())
            weights[-1][:10] += 1.0  # a delta that codes against its base
        ckptzip.save({"w": weights[k]}, path, base=paths[k - 1] if k else None,
                     storage_options=options)
    return weights


def _storage_flags(options: dict, prefix: str = "") -> list[str]:
    """``storage_options`` as the command line's --storage-option KEY=VALUE flags."""
    flags = []
    for key, value in options.items():
        if isinstance(value, dict):
            flags += _storage_flags(value, f"{prefix}{key}.")
        else:
            flags.append(f"--storage-option={prefix}{key}={value}")
    return flags


def test_flatten_in_place_on_s3_keeps_the_deltas_that_need_it(s3_server: SeaweedS3, capsys) -> None:
    """On a bucket prefix, as in a directory: flattening a middle link in place is refused,
    naming the delta coded against it (it succeeded and orphaned every later step); the last
    one, which nothing needs, is flattened. ``decompress --rm`` keeps an object a delta needs
    and deletes one nothing needs."""
    options = s3_server.storage_options()
    flags = ["-q", *_storage_flags(options)]
    run = f"s3://{s3_server.bucket()}/run"
    urls = [f"{run}/step-{k}.ckz" for k in range(3)]
    weights = _chain(urls, options)
    assert main(["flatten", *flags, urls[1]]) == 1
    assert "step-2.ckz" in capsys.readouterr().err
    assert torch.equal(ckptzip.load(urls[2], storage_options=options)["w"], weights[2])
    assert main(["flatten", *flags, urls[2]]) == 0
    with ckptzip.open(urls[2], storage_options=options) as flat:
        assert flat.chain_depth == 0
    assert main(["decompress", *flags, "--rm", urls[0]]) == 0
    assert "step-0.ckz: restored but not removed" in capsys.readouterr().err
    assert main(["decompress", *flags, "--rm", urls[2]]) == 0
    fs = s3_server.filesystem()
    assert not fs.exists(urls[2].removeprefix("s3://")) and fs.exists(urls[0].removeprefix("s3://"))
    assert torch.equal(ckptzip.load(urls[1], storage_options=options)["w"], weights[1])


def test_decompress_rm_keeps_the_bases_of_deltas_still_compressed(tmp_path: Path, capsys) -> None:
    """``decompress --rm`` over a chain removed the keyframe once restored, and every later
    delta then failed for want of its base. A SRC goes only once nothing left is coded against
    it: a delta not named stays, so do its bases, and the user is told which and why."""
    paths = [str(tmp_path / f"step-{k}.ckz") for k in range(4)]
    weights = _chain(paths)
    assert main(["decompress", "-q", "--rm", *paths[:3]]) == 0
    err = capsys.readouterr().err
    assert "step-2.ckz: restored but not removed: 1 delta(s)" in err and "(step-3.ckz)" in err
    assert all(Path(path).exists() for path in paths)
    assert main(["decompress", "-q", "-f", "--rm", *reversed(paths)]) == 0
    assert "not removed" not in capsys.readouterr().err
    assert not any(Path(path).exists() for path in paths)
    for k in range(4):
        assert torch.equal(torch.load(tmp_path / f"step-{k}.pt")["w"], weights[k])


def test_verify_takes_the_base_of_a_delta_from_elsewhere(tmp_path: Path, capsys) -> None:
    """A missing base's message says to pass it with --base: verify now takes it too."""
    paths = [str(tmp_path / f"step-{k}.ckz") for k in range(2)]
    _chain(paths)
    (tmp_path / "elsewhere").mkdir()
    moved = tmp_path / "elsewhere" / "step-0.ckz"
    Path(paths[0]).rename(moved)
    assert main(["verify", paths[1]]) == 1
    assert "--base on the command line" in capsys.readouterr().err
    assert main(["verify", "--base", str(moved), paths[1]]) == 0
    assert "step-1.ckz: OK" in capsys.readouterr().err


def test_inspect_stops_the_chain_at_a_wrong_base(tmp_path: Path, capsys) -> None:
    """Another run's step-1 copied over this run's: inspect said so, then followed the wrong
    file's own base and called this run's intact step-0 an id mismatch too."""
    for seed, run in enumerate("ab"):
        (tmp_path / run).mkdir()
        weights = torch.randn(4096, generator=torch.Generator().manual_seed(seed))
        for k in range(3):
            weights[:10] += 1.0
            ckptzip.save({"w": weights}, tmp_path / run / f"step-{k}.ckz",
                         base=tmp_path / run / f"step-{k - 1}.ckz" if k else None)
    (tmp_path / "b" / "step-1.ckz").replace(tmp_path / "a" / "step-1.ckz")
    capsys.readouterr()
    assert main(["inspect", "--json", str(tmp_path / "a" / "step-2.ckz")]) == 0
    chain = json.loads(capsys.readouterr().out)["chain"]
    assert [link["path"] for link in chain] == ["step-1.ckz"]
    assert chain[0]["status"].startswith("id mismatch")


def test_help_gives_the_adaptive_defaults_and_url_inputs_are_refused_by_name(capsys) -> None:
    """--help called exp_avg=0.3325 the default, though the default codes it as Adam's step at
    0.665 (passing what the help said stored a larger file); a URL SRC was "no such file"."""
    from ckptzip.modes.adaptive import STEP_EXP_AVG_BUDGET

    with pytest.raises(SystemExit):
        main(["compress", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"exp_avg {STEP_EXP_AVG_BUDGET:g} of Adam's step" in text
    assert main(["compress", "-q", "s3://bucket/run/model.pt"]) == 1
    assert "from local paths only" in capsys.readouterr().err
