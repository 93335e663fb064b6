"""The benchmark peers round-trip every kind of array, and ``benchtool`` reports sane rows."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ckptzip
from ckptzip import benchtool, peers
from ckptzip.errors import ConfigError

AVAILABLE = [p for p in peers.PEERS.values() if p.available()]
RNG = np.random.default_rng(0)

#: name -> (array as the peers get it, torch dtype name)
ARRAYS: dict[str, tuple[np.ndarray, str]] = {
    "fp32": (RNG.standard_normal((300, 77)).astype(np.float32) * 0.02, "float32"),
    "bf16": (
        torch.randn(1001, dtype=torch.float32).to(torch.bfloat16).view(torch.uint16).numpy(),
        "bfloat16",
    ),
    "int64": (RNG.integers(-(2**40), 2**40, 999), "int64"),
    "empty": (np.zeros((0, 4), np.float32), "float32"),
    "scalar": (np.array(1.5, np.float32), "float32"),
    "odd-strided": (RNG.standard_normal((33, 17)).astype(np.float32).T, "float32"),
}


@pytest.mark.parametrize("peer", AVAILABLE, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", list(ARRAYS))
@pytest.mark.parametrize("threads", [1, 2])
def test_peer_round_trips(peer: peers.Peer, kind: str, threads: int) -> None:
    array, dtype = ARRAYS[kind]
    before = array.copy()
    blob = peer.compress(array, threads=threads, dtype=dtype)
    assert isinstance(blob, bytes)
    np.testing.assert_array_equal(array, before)  # without scratch=True the input is untouched
    restored = peer.decompress(blob, array, threads=threads, dtype=dtype)
    assert restored.dtype == array.dtype and restored.shape == array.shape
    assert restored.tobytes() == np.ascontiguousarray(array).tobytes()


@settings(max_examples=25, deadline=None)
@given(
    array=hnp.arrays(
        st.sampled_from(["float32", "float16", "uint16", "int8", "int64", "bool", "complex64"]),
        hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=70),
    ),
    threads=st.sampled_from([1, 2]),
)
def test_every_peer_round_trips_any_array(array: np.ndarray, threads: int) -> None:
    dtype = "bfloat16" if array.dtype == np.uint16 else None  # uint16 stands for bf16 here
    for peer in AVAILABLE:
        blob = peer.compress(array, threads=threads, dtype=dtype)
        restored = peer.decompress(blob, array, threads=threads, dtype=dtype)
        assert restored.tobytes() == array.tobytes(), peer.name


@pytest.mark.parametrize("peer", AVAILABLE, ids=lambda p: p.name)
def test_peer_may_use_scratch_input(peer: peers.Peer) -> None:
    array, dtype = ARRAYS["bf16"]
    blob = peer.compress(array.copy(), threads=1, dtype=dtype, scratch=True)
    assert peer.decompress(blob, array, threads=1, dtype=dtype).tobytes() == array.tobytes()


def test_unknown_peer_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="zstd-1"):
        peers.get("gzip-9")


def _tiny_state() -> dict[str, object]:
    torch.manual_seed(0)
    weight = torch.randn(64, 32) * 0.02
    return {
        "model": {"w": weight, "tied": weight, "b": torch.zeros(64, dtype=torch.bfloat16)},
        "optimizer": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(64, 32)}}},
        "step": 3,
    }


def _check_rows(rows: list[benchtool.BenchRow], tools: list[str]) -> None:
    assert [r.tool for r in rows] == tools
    raw = (64 * 32 * 4) * 2 + 64 * 2 + 4  # the tied weight counts once
    for r in rows:
        assert r.raw_bytes == raw and r.stored_bytes > 0 and r.threads == 2
        assert r.ratio == pytest.approx(raw / r.stored_bytes) and r.ratio > 0
        assert r.compress_mbps > 0 and r.decompress_mbps > 0
    table = benchtool.format_table(rows, "tiny")
    assert table.startswith("tiny\n") and all(t in table for t in tools)


def test_compare_peers_on_a_tiny_state() -> None:
    tools = [p.name for p in AVAILABLE]
    _check_rows(benchtool.compare(_tiny_state(), threads=2, repeat=1, peers=tools), tools)


def test_compare_includes_ckptzip() -> None:
    if not hasattr(ckptzip, "dumps"):
        pytest.skip("ckptzip.dumps is not implemented yet (src/ckptzip/api.py)")
    tools = benchtool.default_tools()
    assert tools[0] == benchtool.CKPTZIP
    _check_rows(benchtool.compare(_tiny_state(), threads=2, repeat=1), tools)


def test_compare_times_fresh_processes_and_both_ways_of_threads() -> None:
    """At 2 threads a peer's row says which way (its own threads or a pool over the tensors)
    each direction was faster; a fresh process decodes every tool's output bit for bit."""
    tools = [benchtool.CKPTZIP, *(p.name for p in AVAILABLE[:1])]
    rows = benchtool.compare(_tiny_state(), threads=2, repeat=1, peers=tools, fresh_repeat=1)
    assert [r.tool for r in rows] == tools
    assert all(r.fresh_decompress_mbps and r.fresh_decompress_mbps > 0 for r in rows)
    assert rows[0].how == ""
    for r in rows[1:]:
        c, d = r.how.split(" / ")
        assert {c, d} <= {benchtool.OWN, benchtool.POOL}
    table = benchtool.format_table(rows, "tiny")
    assert "fresh process" in table and "threads used as" in table


def test_fresh_process_decodes_a_delta_against_its_base(tmp_path: Path) -> None:
    """A fresh process decodes ckptzip's delta with the base state's blob decoded off the clock,
    and a peer's XOR delta with the base's raw bytes XORed back; both checked by digest."""
    torch.manual_seed(0)
    base = {"w": torch.randn(64, 32)}
    new = {"w": base["w"] + 1e-3 * torch.randn(64, 32)}
    expected = benchtool.digest([new["w"].numpy()])
    blob = ckptzip.dumps(new, base=base)
    (tmp_path / "c").mkdir()
    spec = benchtool.fresh_spec(tmp_path / "c", benchtool.CKPTZIP, 1, [blob], base=ckptzip.dumps(base))
    assert benchtool.fresh_decode_seconds(spec, expected) > 0
    with pytest.raises(ckptzip.CorruptError, match="bit for bit"):
        benchtool.fresh_decode_seconds(spec, benchtool.digest([base["w"].numpy()]))
    peer = peers.get("zstd-1")
    if not peer.available():
        return
    a, b = new["w"].numpy().view(np.uint8).reshape(-1), base["w"].numpy().view(np.uint8).reshape(-1)
    (tmp_path / "p").mkdir()
    spec = benchtool.fresh_spec(tmp_path / "p", peer.name, 1, [peer.compress(a ^ b, threads=1)],
                                arrays=[(a, "uint8")], base=b.tobytes())
    assert benchtool.fresh_decode_seconds(spec, benchtool.digest([a])) > 0


def test_entropy_bound() -> None:
    rng = np.random.default_rng(1)
    noise = torch.from_numpy(rng.integers(0, 256, 1 << 17, dtype=np.uint8))
    assert benchtool.entropy_bound({"x": noise}) == pytest.approx(1.0, abs=0.01)
    assert math.isinf(benchtool.entropy_bound({"x": torch.zeros(1000, dtype=torch.int32)}))
    # bf16 N(0, 1): the rotated exponent byte holds ~3 bits, the sign+mantissa byte ~8
    normal = torch.randn(1 << 17).to(torch.bfloat16)
    assert 1.3 < benchtool.entropy_bound({"x": normal}) < 1.7
