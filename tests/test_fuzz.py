"""Hostile input (issue #8): short fuzz runs of the atheris harnesses, replays of every committed
fuzz corpus, files whose headers claim huge sizes (memory stays capped by the file's real size),
and files carrying pickle payloads (loading never executes code). fuzz/RESULTS.md has the long
runs; the regression tests at the end each reproduce one bug the fuzzing found."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import ckptzip
from ckptzip import _native
from ckptzip.container import FLAG_DEFLATE, PRELUDE_SIZE, load_header, pack_prelude
from ckptzip.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "fuzz"
CORPUS = FUZZ / "corpus"
sys.path.insert(0, str(FUZZ))

import fuzz_states  # noqa: E402
from make_corpus import fuzz_context  # noqa: E402

ATHERIS = importlib.util.find_spec("atheris") is not None


def split(blob: bytes) -> tuple[dict[str, Any], bytes]:
    flags, length = struct.unpack_from("<IQ", blob, 12)
    header = json.loads(load_header(blob[PRELUDE_SIZE : PRELUDE_SIZE + length], flags, "<test>"))
    return header, blob[PRELUDE_SIZE + length :]


def rebuild(header: dict[str, Any], data: bytes) -> bytes:
    """A file with valid prelude and header checksums around a (tampered) header."""
    raw = json.dumps(header).encode()
    return pack_prelude(raw) + raw + data


def varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def const_stream(n: int) -> bytes:
    """An entropy stream (docs/STREAMS.md) of n copies of one byte: 7 bytes whatever n is."""
    return b"\x01" + varint(n) + b"\x01" + b"\x01\x00"


def corpus(name: str) -> list[Path]:
    files = sorted((CORPUS / name).iterdir())
    assert files, name
    return files


# ---- (a) short atheris runs ---------------------------------------------------------------------


@pytest.mark.skipif(not ATHERIS, reason="atheris not installed (pip install atheris)")
@pytest.mark.parametrize(("harness", "seeds", "runs"),
                         [("container", "container", 4000), ("lazy", "container", 3000),
                          ("codecs", "codecs", 20000)])
def test_atheris_short_run(harness: str, seeds: str, runs: int, tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, str(FUZZ / f"atheris_{harness}.py"), f"-runs={runs}", "-rss_limit_mb=2048",
         "-timeout=10", "-seed=1", f"-artifact_prefix={tmp_path}/", str(tmp_path),
         str(CORPUS / seeds)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert f"Done {runs} runs" in res.stderr


# ---- (b) corpus replays -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def harnesses() -> dict[str, Any]:
    """The atheris harness modules (they import without atheris: replay only)."""
    return {name: importlib.import_module(f"atheris_{name}") for name in ("container", "lazy", "codecs")}


@pytest.mark.parametrize(("harness", "seeds"), [("container", "container"), ("lazy", "container"),
                                                ("codecs", "codecs")])
def test_atheris_corpus_replays(harnesses: dict[str, Any], harness: str, seeds: str) -> None:
    """Every seed through its harness's entry point: a value or a ckptzip.Error, nothing else."""
    for path in corpus(seeds):
        harnesses[harness].test_one_input(path.read_bytes())


def test_container_seeds_are_real_files() -> None:
    """The seeds load whole (with their checksums fixed up as the harness does): they start the
    fuzzer deep in the reader, not at a checksum failure."""
    from atheris_common import BASE, fix_checksums

    for path in corpus("container"):
        state = ckptzip.loads(fix_checksums(path.read_bytes(), keep_some=False), base=BASE, threads=1)
        assert isinstance(state, dict) and state


def test_codec_seeds_decode(harnesses: dict[str, Any]) -> None:
    """Every codec seed decodes without an error: each is a real chunk or transform input."""
    failures: list[str] = []
    module = harnesses["codecs"]
    for path in corpus("codecs"):
        try:
            data = path.read_bytes()
            size = int.from_bytes(data[:2], "little")
            spec = json.loads(data[2 : 2 + size])
            pipeline = Pipeline.from_config(spec["pipeline"])
            run = module._transforms if pipeline.transforms else module._chunk
            if not run(pipeline, spec, data[2 + size :]):
                failures.append(f"{path.name}: not admitted")
        except ckptzip.Error as exc:
            failures.append(f"{path.name}: {exc}")
    assert not failures
    ids = set()
    for path in corpus("codecs"):
        size = int.from_bytes(path.read_bytes()[:2], "little")
        ids |= {c["id"] for c in json.loads(path.read_bytes()[2 : 2 + size])["pipeline"]}
    assert ids == set(ckptzip.codecs.registered_ids())  # every registered codec has seeds


#: First bytes of context-bucketed streams: format 4 (written now; format 3 for 1-byte elements
#: and chunks with many escapes), format 3 and format 2 (written before, still read).
FORMAT3, FORMAT2 = b"\x03", b"\x02"
CTX_FORMATS = (bytes([_native.CTX_STREAM_FORMAT]), FORMAT3, FORMAT2)


def test_libfuzzer_decode_corpus_replays() -> None:
    """fuzz/corpus/decode through the Python entry points of the same decoders: today's seeds
    decode, every seed gives a value or a ckptzip.Error."""
    entropy = ckptzip.codecs.Entropy()
    decoded = 0
    for path in corpus("decode"):
        ctl, stream = path.read_bytes()[0], path.read_bytes()[1:]
        try:
            n = entropy.decoded_size(stream)
            if stream[:1] in CTX_FORMATS:
                k = 1 << ((ctl >> 2) & 3)
                out = bytearray(n)
                _native.decode_planes_ctx(stream, fuzz_context(n // k, ctl), out, k,
                                          (ctl >> 4) % (8 * k))
            else:
                entropy.decode(stream, bytearray(n))
            decoded += 1
        except ckptzip.Error:
            assert path.name.startswith("legacy-"), path.name
    assert decoded >= len(corpus("decode")) - 1


def test_libfuzzer_delta_corpus_replays() -> None:
    """fuzz/corpus/delta through Pipeline.decode_chunk, as the reader decodes a delta chunk."""
    kinds = {0: "xor", 1: "float-diff", 2: "int-diff"}
    for path in corpus("delta"):
        data = path.read_bytes()
        ctl, (length,) = data[0], struct.unpack_from("<I", data, 1)
        base, stream = data[5 : 5 + length], data[5 + length :]
        width, rotate = 1 << ((ctl >> 2) & 3), ctl >> 4
        second = ({"id": "ctxplanes", "width": width, "rotate": rotate}
                  if stream[:1] in CTX_FORMATS else
                  {"id": "byteplanes", "width": width, "rotate": rotate})
        configs = [{"id": "residual", "kind": kinds[ctl & 3], "width": width}, second]
        if second["id"] == "byteplanes":
            configs.append({"id": "entropy"})
        pipeline = Pipeline.from_config(configs)
        out = bytearray(length)
        pipeline.decode_chunk(stream, out, base)
        again = pipeline.encode_chunk(bytes(out), base)
        if stream[:1] in CTX_FORMATS and again[:1] != stream[:1]:
            # a seed of an earlier writer (format 2 or 3): re-encoded in today's format
            back = bytearray(length)
            pipeline.decode_chunk(again, back, base)
            assert back == out and stream[:1] != bytes([_native.CTX_STREAM_FORMAT])
            assert again[:1] == bytes([_native.CTX_STREAM_FORMAT]) or width == 1
        else:
            assert again == stream  # the writer's chunk, exactly


# ---- (c) memory is capped by the file's real size -----------------------------------------------

MEMORY_CHILD = textwrap.dedent(
    """
    import json, resource, struct, sys, tracemalloc, zlib
    sys.path[:0] = {paths!r}
    import torch, ckptzip, fuzz_states
    from ckptzip import _native
    from ckptzip.container import FLAG_DEFLATE, pack_prelude
    from test_fuzz import const_stream, rebuild, split

    SMALL = ckptzip.dumps({{"w": torch.arange(64, dtype=torch.uint8)}}, threads=1)
    BASE = fuzz_states.base_state()
    BITSNAP = ckptzip.dumps(fuzz_states.next_state(), base=BASE, mode="bitsnap", threads=1)
    MiB = 64 << 20

    def leaf(shape, chunk, chunks, data, pipeline=None):
        header, _ = split(SMALL)
        entry = header["leaves"][0]
        entry.update(shape=shape, chunk=chunk, offset=0, chunks=chunks)
        if pipeline is not None:
            header["pipelines"].append(pipeline)
            entry["pipeline"] = len(header["pipelines"]) - 1
        header["data_length"] = len(data)
        return rebuild(header, data)

    def ones(n, data=b"\\0"):
        return [[len(data), _native.crc32c(data), 0]] * n

    def tampered(blob, fn):
        header, data = split(blob)
        fn(header)
        return rebuild(header, data)

    def sparse_shape(header):
        for config in header["pipelines"]:
            for stage in config:
                if stage["id"] == "sparse":
                    stage["shape"] = [1 << 28]

    packer = zlib.compressobj(9)  # 200 MB of JSON in ~200 KB, made without holding the 200 MB
    bomb = packer.compress(b"[") + b"".join(packer.compress(bytes(b" " * (1 << 20))) for _ in range(200))
    bomb += packer.compress(b"]") + packer.flush()
    header, data = split(SMALL)
    header_length = bytearray(SMALL)
    struct.pack_into("<Q", header_length, 16, 1 << 60)
    struct.pack_into("<I", header_length, 28, _native.crc32c(bytes(header_length[:28])))
    CASES = {{
        "shape 2**40 elements, one chunk": leaf([1 << 40], MiB, ones(1), b"\\0"),
        "shape 2**40 in 1-byte chunks: 2**40 chunks": leaf([1 << 40], 1, ones(1), b"\\0"),
        "10**5 chunk entries in 100 bytes": leaf([10**5], 1, ones(10**5), bytes(100)),
        "chunk size 2**62": leaf([64], 1 << 62, ones(1), b"\\0"),
        "stored length 2**62": leaf([64], 64, [[1 << 62, 0, 0]], b"\\0"),
        "header length 2**60": bytes(header_length),
        "1 TiB in 16384 one-byte chunks": leaf([1 << 40], MiB, ones(16384), bytes(16384)),
        "16 GiB in 256 valid-CRC chunks": leaf([1 << 34], MiB, ones(256), bytes(256)),
        "16 GiB of CONST chunks, bad raw CRC": leaf([1 << 34], MiB, ones(256, const_stream(MiB)),
                                                    const_stream(MiB) * 256),
        "stream declaring 2**40 bytes": leaf([64], 64, ones(1, const_stream(1 << 40)),
                                             const_stream(1 << 40), [{{"id": "entropy"}}]),
        "sparse stage of 2**28 elements": tampered(BITSNAP, sparse_shape),
        "deflate bomb header": pack_prelude(bomb, FLAG_DEFLATE) + bomb + data,
    }}
    tracemalloc.start()
    for name, blob in CASES.items():
        try:
            ckptzip.loads(blob, base=BASE, threads=1)
        except ckptzip.Error as exc:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss >> 10
            print(name, "->", type(exc).__name__, str(exc)[:150], f"(max RSS {{rss}} MiB)")
        else:
            raise SystemExit(name + ": loaded")
    peak = tracemalloc.get_traced_memory()[1]
    print("RESULT", peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
          max(len(b) for b in CASES.values()))
    """
)

BASELINE_CHILD = textwrap.dedent(
    """
    import resource, sys
    sys.path[:0] = {paths!r}
    import torch, ckptzip, fuzz_states
    base = fuzz_states.base_state()
    blob = ckptzip.dumps(fuzz_states.next_state(), base=base, mode="bitsnap", threads=1)
    ckptzip.loads(blob, base=base, threads=1)
    print("RESULT", 0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, 0)
    """
)


def run_child(code: str) -> tuple[int, int, int, str]:
    paths = [str(ROOT / "src"), str(FUZZ), str(ROOT / "tests")]
    res = subprocess.run([sys.executable, "-c", code.format(paths=paths)], capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT"))
    peak, rss, largest = (int(x) for x in line.split()[1:])
    return peak, rss, largest, res.stdout


def test_huge_claims_are_rejected_without_large_allocations() -> None:
    """Headers claiming 2**40 elements, 2**40 or 10**5 chunks, 2**62-byte chunks and stored
    lengths, a 2**60-byte header, 1 TiB and 16 GiB tensors, a stream declaring 2**40 bytes, a
    sparse stage of 2**28 elements and a deflate bomb: each load raises a ckptzip.Error, and the
    process's peak memory stays within a small margin of loading a normal small file."""
    _, baseline, _, _ = run_child(BASELINE_CHILD)
    peak, rss, largest, out = run_child(MEMORY_CHILD)
    # Python allocations stay within a few times the largest file (the JSON of a 10**5-entry
    # chunk table is the largest); the process stays within 300 MB of the baseline.
    assert peak < 40 * largest + (64 << 20), out
    assert rss < baseline + (300 << 20), (rss, baseline, out)


# ---- (d) loading never executes code ------------------------------------------------------------


class _Marker:
    """Unpickling this creates the marker file: proof that a pickle was executed."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        return (open, (self.path, "w"))


@pytest.fixture()
def payloads(tmp_path: Path) -> dict[str, Any]:
    marker = tmp_path / "EXECUTED"
    payload = pickle.dumps(_Marker(str(marker)), protocol=2)
    text = payload.decode("latin-1")
    state = {
        "w": torch.randn(8, 4),
        text: torch.ones(3),  # a tensor whose key (so its name) is the pickle
        "raw": payload,  # a bytes leaf: the pickle as a raw chunk
        "strings": [text, {"k": text}],
    }
    blob = ckptzip.dumps(state, metadata={"m": text, text: [text]}, threads=1)
    header, data = split(blob)
    header["tree"]["o"]["evil"] = {"t": "pickle", "v": payload.hex()}  # a node kind that is none
    header["id"] = text
    evil_node = rebuild(header, data)
    header, data = split(blob)
    header["pipelines"].append([{"id": "pickle", "v": payload.hex()}])
    header["leaves"][0]["pipeline"] = len(header["pipelines"]) - 1
    evil_codec = rebuild(header, data)
    pt = tmp_path / "torch.pt"
    torch.save({"x": _Marker(str(marker))}, pt)
    files = {"clean": blob, "node": evil_node, "codec": evil_codec, "torch.save": pt.read_bytes(),
             "raw pickle": payload, "pickle after prelude": pack_prelude(payload) + payload}
    paths = {}
    for name, content in files.items():
        path = tmp_path / (name.replace(" ", "_") + ".ckz")
        path.write_bytes(content)
        paths[name] = path
    return {"marker": marker, "payload": payload, "text": text, "paths": paths, "state": state}


def _plain(value: Any) -> bool:
    """Only the types a ckptzip tree can hold: no object the file could have chosen."""
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, int, float, complex, str, bytes, bytearray,
                                               torch.Tensor, np.ndarray, np.generic, torch.dtype,
                                               torch.device, torch.Size))


@pytest.fixture()
def no_unpickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """pickle.loads, pickle.load, pickle.Unpickler and torch.load raise while the test runs."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a reader used pickle or torch.load")

    class Refused:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            refuse()

    for module, name in [(pickle, "loads"), (pickle, "load"), (torch, "load")]:
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setattr(pickle, "Unpickler", Refused)


@pytest.mark.usefixtures("no_unpickling")
def test_loading_never_executes_code(payloads: dict[str, Any]) -> None:
    marker = payloads["marker"]
    for name, path in payloads["paths"].items():
        outcomes = []
        for load in (lambda p: ckptzip.load(p, threads=1), lambda p: ckptzip.loads(p.read_bytes())):
            try:
                outcomes.append(load(path))
            except ckptzip.Error:
                outcomes.append(None)
        try:
            with ckptzip.open(path) as ckpt:
                _ = ckpt.metadata, ckpt.id
                for key in ckpt.keys():  # noqa: SIM118 (no __iter__)
                    outcomes.append(ckpt.get_tensor(key))
                ckpt.verify()
        except ckptzip.Error:
            pass
        assert not marker.exists(), name
        assert all(_plain(o) for o in outcomes), name
        if name == "clean":  # the pickle bytes come back as plain data, unexecuted
            state = outcomes[0]
            assert state["raw"] == payloads["payload"] and state["strings"][0] == payloads["text"]
            assert torch.equal(state[payloads["text"]], torch.ones(3))
        else:
            assert outcomes[:2] == [None, None], name


@pytest.mark.usefixtures("no_unpickling")
def test_cli_never_executes_code(payloads: dict[str, Any], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``ckptzip -d``, ``inspect`` and ``verify`` (in process, with pickle and torch.load
    refused as above); one subprocess run shows the same from the command line."""
    from ckptzip.cli import main

    marker = payloads["marker"]
    for name, path in payloads["paths"].items():
        for args in (["-d", "--to", "pt", "-o", str(tmp_path / f"out-{path.stem}.pt")],
                     ["inspect"], ["verify"]):
            code = main([*args, str(path)])
            err = capsys.readouterr().err
            # an unknown tree node stops a load and verify (which checks the tree a load builds);
            # inspect lists the tensors without it
            readable = name == "clean" or (name == "node" and args[0] == "inspect")
            assert (code == 0) == readable, (name, args, err[-2000:])
            assert not marker.exists(), (name, args)
    res = subprocess.run([sys.executable, "-m", "ckptzip.cli", "-d", "-o", str(tmp_path / "x.pt"),
                          str(payloads["paths"]["torch.save"])], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert res.returncode != 0 and "not a .ckz" in res.stderr and "Traceback" not in res.stderr
    assert not marker.exists()


READERS = ["api", "chain", "container", "dtypes", "pipeline", "reader", "tree", "codecs/base",
           "codecs/byteplanes", "codecs/context", "codecs/dither", "codecs/entropy", "codecs/kmeans",
           "codecs/lossy_residual", "codecs/lowrank", "codecs/mark", "codecs/residual", "codecs/sparse",
           "codecs/support"]


@pytest.mark.parametrize("module", READERS)
def test_reader_modules_have_no_code_execution_paths(module: str) -> None:
    """No pickle import, no eval/exec, no torch.load anywhere on the load path."""
    source = (ROOT / "src" / "ckptzip" / f"{module}.py").read_text()
    for needle in ("import pickle", "from pickle", "eval(", "exec(", "torch.load(", "__import__",
                   "importlib", "marshal"):
        assert needle not in source, (module, needle)


# ---- regressions: bugs the fuzzing found --------------------------------------------------------

BASE = fuzz_states.base_state()


def test_residual_leaf_without_base_reference_is_a_format_error() -> None:
    """atheris_container: a residual leaf whose 'base' key was mutated away raised ValueError."""
    blob = ckptzip.dumps(fuzz_states.next_state(), base=BASE, threads=1)
    header, data = split(blob)
    for entry in header["leaves"]:
        entry.pop("base", None)
    with pytest.raises(ckptzip.FormatError, match="without a base reference"):
        ckptzip.loads(rebuild(header, data), base=BASE, threads=1)


def test_stream_cannot_make_the_reader_allocate_what_it_declares() -> None:
    """A 7-byte stream in a pipeline without the fused kernel declared 2**40 bytes: the reader
    allocated them (MemoryError, or gigabytes filled for smaller claims) before checking."""
    blob = ckptzip.dumps({"w": torch.arange(64, dtype=torch.uint8)}, threads=1)
    header, _ = split(blob)
    stream = const_stream(1 << 40)
    header["pipelines"] = [[{"id": "entropy"}]]
    header["leaves"][0].update(pipeline=0, offset=0, chunks=[[len(stream), _native.crc32c(stream), 0]])
    header["data_length"] = len(stream)
    # the reader's batched native decode checks the declared size against the chunk's
    with pytest.raises(ckptzip.CorruptError, match="holds 64 bytes but the stream decodes to 1099511627776"):
        ckptzip.loads(rebuild(header, stream), threads=1)
    out = bytearray(64)
    with pytest.raises(ckptzip.CorruptError, match="at most"):
        Pipeline.from_config([{"id": "entropy"}, {"id": "entropy"}]).decode_chunk(
            const_stream(1 << 30), out)


def test_unallocatable_tensor_claim_is_a_ckptzip_error() -> None:
    """16384 one-byte chunks of 64 MiB each: 1 TiB, more than the host can map; torch's
    RuntimeError escaped the reader."""
    blob = ckptzip.dumps({"w": torch.arange(64, dtype=torch.uint8)}, threads=1)
    header, _ = split(blob)
    n = 16384
    header["leaves"][0].update(shape=[1 << 40], chunk=64 << 20, offset=0,
                               chunks=[[1, _native.crc32c(b"\0"), 0]] * n)
    header["data_length"] = n
    with pytest.raises(ckptzip.Error):
        ckptzip.loads(rebuild(header, bytes(n)), threads=1)


def test_sparse_stage_must_match_its_tensor() -> None:
    """A sparse stage declaring more elements than its tensor made the decode fill them all
    (2**26 here: 256 MiB) before the shape check; the parser now refuses the header."""
    blob = ckptzip.dumps(fuzz_states.next_state(), base=BASE, mode="bitsnap", threads=1)
    header, data = split(blob)
    stages = [s for p in header["pipelines"] for s in p if s["id"] == "sparse"]
    assert stages
    for stage in stages:
        stage["shape"] = [1 << 26]
    with pytest.raises(ckptzip.FormatError, match="declares 67108864 elements"):
        ckptzip.loads(rebuild(header, data), base=BASE, threads=1)


def test_deflated_plain_json_seed_round_trip() -> None:
    """The harness's fix-up deflates a plain JSON header stored under the deflate flag."""
    from atheris_common import fix_checksums

    blob = ckptzip.dumps({"w": torch.ones(4)}, threads=1)
    header, data = split(blob)
    raw = json.dumps(header).encode()
    seed = pack_prelude(raw, FLAG_DEFLATE) + raw + data
    with pytest.raises(ckptzip.Error):
        ckptzip.loads(seed)
    fixed = fix_checksums(seed, keep_some=False)
    assert struct.unpack_from("<I", fixed, 12)[0] == FLAG_DEFLATE
    assert zlib.decompress(fixed[PRELUDE_SIZE : PRELUDE_SIZE + struct.unpack_from("<Q", fixed, 16)[0]])
    assert torch.equal(ckptzip.loads(fixed)["w"], torch.ones(4))


def test_empty_tensor_with_a_lossy_transform_and_a_base() -> None:
    """atheris_codecs: an empty tensor coded against an (empty) base tensor raised torch's
    RuntimeError: numpy gives an empty array a zero stride, and viewing it as float fails."""
    blob = ckptzip.dumps({"w": torch.empty(0)}, threads=1)
    header, data = split(blob)
    header["pipelines"].append([{"id": "lossy-residual", "dtype": "float32"}])
    header["leaves"][0].update(pipeline=len(header["pipelines"]) - 1, chunks=[],
                               encoded={"dtype": "float32", "shape": [0]},
                               base={"name": "w", "crc": _native.crc32c(b"")})
    header["base"] = {}  # a delta of an in-memory state
    state = ckptzip.loads(rebuild(header, data), base={"w": torch.empty(0)}, threads=1)
    assert state["w"].shape == (0,) and state["w"].dtype == torch.float32


@pytest.mark.parametrize(
    "tamper",
    [
        lambda t: t.update(m=1),  # AttributeError: metadata set on a plain dict
        lambda t: t["o"]["w"].update(grad=True),  # RuntimeError: an int tensor requiring grad
        lambda t: t["o"].update(s={"t": "size", "v": [1 << 70]}),  # ValueError: overflow
        lambda t: t["o"].update(v={"t": "view", "i": 0, "shape": [0, 1 << 63],
                                   "stride": [1 << 63, 1], "offset": 0}),  # TypeError
        lambda t: t["o"].update(v={"t": "view", "i": 0, "shape": [0], "stride": [1],
                                   "offset": 1 << 70}),  # ValueError: overflow
    ],
)
def test_malformed_tree_nodes_are_format_errors(tamper: Callable[[dict[str, Any]], None]) -> None:
    """Tree nodes no writer makes raised AttributeError, RuntimeError, ValueError or TypeError."""
    header, data = split(ckptzip.dumps({"w": torch.arange(4), "f": torch.ones(2)}, threads=1))
    tamper(header["tree"])
    with pytest.raises(ckptzip.FormatError, match="malformed tree"):
        ckptzip.loads(rebuild(header, data), threads=1)


@pytest.mark.parametrize("where", ["key", "metadata", "complex"])
def test_leaves_referenced_outside_leaf_refs_are_decoded(where: str) -> None:
    """A tensor referenced from a dict key, dict metadata or a complex part (places leaf_refs does
    not walk) was never decoded: KeyError. It is decoded on demand now."""
    header, data = split(ckptzip.dumps({"w": torch.arange(4), "f": torch.ones(2)}, threads=1))
    ref = {"t": "tensor", "i": 0}
    tree = {"key": {"t": "dict", "k": [ref], "v": [1]},
            "metadata": {"t": "dict", "ordered": True, "o": {}, "m": ref},
            "complex": {"t": "complex", "v": [ref, 1.0]}}[where]
    header["tree"] = tree
    try:
        state = ckptzip.loads(rebuild(header, data), threads=1)
    except ckptzip.FormatError as exc:
        assert where == "complex" and "floats" in str(exc)
    else:
        assert where != "complex" and _plain(state)


def test_bytes_node_needs_a_uint8_leaf() -> None:
    """atheris_container: a 'bytes' node on a leaf of another dtype (uint7 here) raised
    TypeError from numpy."""
    header, data = split(ckptzip.dumps({"b": b"abcdefgh"}, threads=1))
    header["leaves"][0]["dtype"] = "uint7"
    with pytest.raises(ckptzip.FormatError, match=r"bytes from a torch\.uint7"):
        ckptzip.loads(rebuild(header, data), threads=1)


@pytest.mark.parametrize("changed", [0.0, 0.002])
def test_bitsnap_of_a_barely_changed_tensor_loads(changed: float) -> None:
    """A bitsnap delta of an unchanged (or 0.2 % changed) tensor holds a sparse index list far
    smaller than the tensor: the parser's expansion bound refused the files the writer made.
    Leaves coded against a base are bounded by the base tensor instead."""
    torch.manual_seed(0)
    w = torch.randn(256, 128)
    new = w.clone()
    new.view(-1)[torch.randperm(w.numel())[: int(changed * w.numel())]] += 0.5
    base = {"model": {"w": w}}
    blob = ckptzip.dumps({"model": {"w": new}}, base=base, mode="bitsnap", threads=1)
    out = ckptzip.loads(blob, base=base, threads=1)["model"]["w"]
    assert out.shape == w.shape and float((out - new).abs().max()) < 0.05
    # a base of another shape is refused before any decode
    with pytest.raises(ckptzip.BaseMismatchError):
        ckptzip.loads(blob, base={"model": {"w": torch.zeros(1 << 20)}}, threads=1)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize("target", ["fifo", "/dev/zero"])
def test_a_base_path_that_is_no_regular_file_is_refused(tmp_path: Path, target: str) -> None:
    """A delta whose header names a FIFO as its base made load block forever opening it; the
    header's base must be a regular file."""
    os.mkfifo(tmp_path / "fifo")
    header, data = split(ckptzip.dumps(fuzz_states.next_state(), base=BASE, threads=1))
    header["base"]["path"] = target
    (tmp_path / "delta.ckz").write_bytes(rebuild(header, data))
    code = (f"import ckptzip\ntry:\n    ckptzip.load({str(tmp_path / 'delta.ckz')!r})\n"
            f"except ckptzip.BaseMismatchError as exc:\n    print('refused', exc)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "refused" in res.stdout and "missing" in res.stdout, res.stdout + res.stderr
