"""Round trips: every dtype torch has, every shape, through the public API, bit for bit."""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptzip
from ckptzip import dtypes

ALL_DTYPES = [d.torch_dtype for d in dtypes._BY_NAME.values() if d.torch_dtype is not None]


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bit patterns of ``dtype`` (every byte value, NaNs and infinities included)."""
    generator = np.random.default_rng(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = int(np.prod(shape)) if shape else 1
    raw = generator.integers(0, 256, size=numel * itemsize, dtype=np.uint8)
    if dtype == torch.bool:
        raw &= 1
    flat = torch.from_numpy(raw) if raw.size else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(shape)


def assert_bit_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    a_bytes = a.contiguous().reshape(-1).view(torch.uint8)
    b_bytes = b.contiguous().reshape(-1).view(torch.uint8)
    assert torch.equal(a_bytes, b_bytes)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips(dtype: torch.dtype) -> None:
    state = {
        "matrix": random_tensor(dtype, (37, 53), 1),
        "scalar": random_tensor(dtype, (), 2),
        "empty": random_tensor(dtype, (0, 4), 3),
        "long": random_tensor(dtype, (300_001,), 4),
    }
    out = ckptzip.loads(ckptzip.dumps(state, threads=2), threads=2)
    for key, value in state.items():
        assert_bit_equal(value, out[key])


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(ALL_DTYPES),
    shape=st.lists(st.integers(0, 9), min_size=0, max_size=4).map(tuple),
    seed=st.integers(0, 2**32 - 1),
    threads=st.sampled_from([1, 2]),
)
def test_hypothesis_dtypes_and_shapes(dtype, shape, seed, threads) -> None:
    tensor = random_tensor(dtype, shape, seed)
    out = ckptzip.loads(ckptzip.dumps({"t": tensor}, threads=threads), threads=threads)
    assert_bit_equal(tensor, out["t"])


@settings(max_examples=40, deadline=None)
@given(
    values=st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), max_size=3000),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
)
def test_hypothesis_float_values(values, dtype) -> None:
    tensor = torch.tensor(values, dtype=torch.float32).to(dtype)
    assert_bit_equal(tensor, ckptzip.loads(ckptzip.dumps([tensor]))[0])


def test_skewed_and_structured_data() -> None:
    state = {
        "zeros": torch.zeros(1 << 20),
        "ones_bf16": torch.ones(70_000, dtype=torch.bfloat16),
        "steps": torch.arange(100_000, dtype=torch.int64),
        "normal": torch.randn(513, 1031),
        "tiny_normal": torch.randn(200_000) * 1e-30,
    }
    blob = ckptzip.dumps(state)
    out = ckptzip.loads(blob)
    for key, value in state.items():
        assert_bit_equal(value, out[key])
    raw = sum(v.numel() * v.element_size() for v in state.values())
    assert len(blob) < raw * 0.6  # zeros, ones and small ints compress far


def test_non_contiguous_views_keep_values() -> None:
    base = torch.randn(64, 48)
    state = {"t": base.t(), "slice": base[::3, 5:17], "expanded": torch.randn(5, 1).expand(5, 7)}
    out = ckptzip.loads(ckptzip.dumps(state))
    for key, value in state.items():
        assert torch.equal(value, out[key])


def test_numpy_arrays_round_trip() -> None:
    state = {
        "f8": np.random.default_rng(0).standard_normal((10, 3)),
        "big_endian": np.arange(20, dtype=">i4"),
        "u2": np.arange(7, dtype=np.uint16),
        "c": (np.arange(6) * 1j).astype(np.complex64),
        "b": np.array([True, False]),
        "zero_d": np.array(3.5, dtype=np.float32),
        "scalar": np.float32(2.5),
        "int_scalar": np.int64(-7),
    }
    out = ckptzip.loads(ckptzip.dumps(state))
    for key, value in state.items():
        assert type(out[key]) is type(value), key
        assert np.array_equal(np.asarray(out[key]), np.asarray(value)), key
        assert np.asarray(out[key]).dtype.newbyteorder("=") == np.asarray(value).dtype.newbyteorder("=")


def test_python_values_keep_their_types() -> None:
    state = {
        1: "int key",
        (2, "x"): "tuple key",
        None: "none key",
        2.5: [1, 2.0, True, None, "s", b"\x00\xff", bytearray(b"ab"), complex(1, -2)],
        "nested": ({"a": (1, (2, [3]))},),
        "floats": [float("nan"), float("inf"), float("-inf"), -0.0, 1e-310],
        "big": 2**100,
        "dtype": torch.bfloat16,
        "device": torch.device("cpu"),
        "size": torch.Size([2, 3]),
        "ordered": OrderedDict([("z", 1), ("a", 2)]),
    }
    out = ckptzip.loads(ckptzip.dumps(state))
    assert list(out) == list(state)
    assert out[2.5] == state[2.5] and [type(v) for v in out[2.5]] == [type(v) for v in state[2.5]]
    assert out["nested"] == state["nested"] and type(out["nested"][0]["a"][1]) is tuple
    floats = out["floats"]
    assert np.isnan(floats[0]) and floats[1:3] == [float("inf"), float("-inf")]
    assert str(floats[3]) == "-0.0" and floats[4] == 1e-310
    assert out["big"] == 2**100 and out["dtype"] is torch.bfloat16
    assert out["device"] == torch.device("cpu") and out["size"] == torch.Size([2, 3])
    assert type(out["size"]) is torch.Size
    assert type(out["ordered"]) is OrderedDict and list(out["ordered"]) == ["z", "a"]


def test_tied_weights_are_stored_once_and_come_back_shared() -> None:
    weight = torch.randn(256, 64)
    state = OrderedDict(embed=weight, head=weight.detach(), other=torch.randn(3))
    blob = ckptzip.dumps(state)
    untied = ckptzip.dumps(OrderedDict(embed=weight, head=weight.clone(), other=state["other"]))
    assert len(blob) < len(untied) * 0.6
    out = ckptzip.loads(blob)
    assert torch.equal(out["embed"], weight)
    assert out["head"].untyped_storage().data_ptr() == out["embed"].untyped_storage().data_ptr()


def test_overlapping_views_share_storage() -> None:
    base = torch.randn(100)
    state = {"a": base[10:60], "b": base[40:90].view(5, 10), "c": base[::2]}
    out = ckptzip.loads(ckptzip.dumps(state))
    for key in state:
        assert torch.equal(out[key], state[key])
    out["a"][35] = 123.0  # element 45 of the original storage, inside b as well
    assert out["b"][0, 5].item() == 123.0


def test_parameters_and_requires_grad() -> None:
    state = {"p": torch.nn.Parameter(torch.randn(3)), "g": torch.randn(2, requires_grad=True)}
    out = ckptzip.loads(ckptzip.dumps(state))
    assert isinstance(out["p"], torch.nn.Parameter) and out["p"].requires_grad
    assert out["g"].requires_grad and not isinstance(out["g"], torch.nn.Parameter)


def test_full_training_state_round_trips_exactly() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
    for _ in range(4):
        model(torch.randn(5, 8)).square().mean().backward()
        optimizer.step()
        scheduler.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": 123,
        "rng": torch.get_rng_state(),
    }
    out = ckptzip.loads(ckptzip.dumps(state))
    assert type(out["model"]) is OrderedDict
    assert out["model"]._metadata == state["model"]._metadata
    assert list(out["optimizer"]["state"]) == list(state["optimizer"]["state"])
    assert all(type(k) is int for k in out["optimizer"]["state"])
    assert out["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    assert out["scheduler"] == state["scheduler"]
    for name, value in state["model"].items():
        assert_bit_equal(value, out["model"][name])
    for pid, moments in state["optimizer"]["state"].items():
        for key, value in moments.items():
            assert_bit_equal(value, out["optimizer"]["state"][pid][key])
    assert torch.equal(out["rng"], state["rng"])
    fresh = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))
    fresh.load_state_dict(out["model"])
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_opt.load_state_dict(out["optimizer"])


def test_save_load_file_and_report(tmp_path) -> None:
    state = {"w": torch.randn(1000, 100).bfloat16(), "step": 7}
    path = tmp_path / "ckpt.ckz"
    report = ckptzip.save(state, path, metadata={"run": "test", "lr": 0.1})
    assert report.raw_bytes == 200_000 and report.stored_bytes == path.stat().st_size
    assert report.ratio == pytest.approx(report.raw_bytes / report.stored_bytes)
    assert report.seconds > 0
    out = ckptzip.load(path, threads=1)
    assert_bit_equal(state["w"], out["w"]) and out["step"] == 7
    with ckptzip.open(path) as ckpt:
        assert ckpt.metadata == {"run": "test", "lr": 0.1}
        assert ckpt.keys() == ["w"]
        assert_bit_equal(ckpt.get_tensor("w"), state["w"])


def test_fsspec_url_round_trip() -> None:
    state = {"w": torch.randn(300, 7)}
    ckptzip.save(state, "memory://ckptzip-test/a.ckz")
    assert torch.equal(ckptzip.load("memory://ckptzip-test/a.ckz")["w"], state["w"])
    with ckptzip.open("memory://ckptzip-test/a.ckz") as ckpt:
        assert torch.equal(ckpt.get_tensor("w"), state["w"])


def test_lazy_open_reads_only_the_tensor_asked_for(tmp_path, monkeypatch) -> None:
    state = {"model": {"a": torch.randn(50_000), "b": torch.randn(200_000)}, "n": 3}
    path = tmp_path / "lazy.ckz"
    ckptzip.save(state, path)
    with ckptzip.open(path) as ckpt:
        assert ckpt.keys() == ["model.a", "model.b"]
        reads: list[tuple[int, int]] = []
        original = ckpt.source.read

        def spy(offset: int, length: int):
            reads.append((offset, length))
            return original(offset, length)

        monkeypatch.setattr(ckpt.source, "read", spy)
        assert torch.equal(ckpt.get_tensor("model.a"), state["model"]["a"])
        assert sum(length for _, length in reads) < 50_000 * 4
        with pytest.raises(ckptzip.KeyNotFoundError, match=r"keys\(\)") as raised:
            ckpt.get_tensor("model.c")
        assert isinstance(raised.value, KeyError) and str(raised.value).startswith(str(path))


def test_map_location_meta_is_rejected_and_cpu_is_default() -> None:
    blob = ckptzip.dumps({"w": torch.ones(3)})
    assert ckptzip.loads(blob, map_location=torch.device("cpu"))["w"].device.type == "cpu"
    with pytest.raises(ckptzip.Error, match="map_location"):
        ckptzip.loads(blob, map_location=object())


def test_map_location_moves_tensors_and_leaves_arrays_and_bytes_on_the_host() -> None:
    """A state with numpy's RNG state or bytes failed to load onto another device: every leaf
    was moved there first, then ``.numpy()`` was called on it (a raw TypeError). Tensors go to
    the device, once each; arrays and bytes are made on the host."""
    weight = torch.arange(6.0)
    state = {"w": weight, "tied": weight, "view": weight[2:], "rng": np.random.get_state(),
             "blob": b"\x00\x01", "array": np.arange(4)}
    loaded = ckptzip.loads(ckptzip.dumps(state), map_location="meta")
    assert loaded["w"].device.type == loaded["tied"].device.type == "meta"
    assert loaded["view"].device.type == "meta" and loaded["view"].shape == (4,)
    assert loaded["blob"] == b"\x00\x01" and np.array_equal(loaded["array"], np.arange(4))
    assert np.array_equal(loaded["rng"][1], state["rng"][1])


def test_colliding_and_tuple_key_names() -> None:
    state = {"a.b": torch.ones(2), "a": {"b": torch.zeros(2)}, (1, "x"): torch.arange(3)}
    blob = ckptzip.dumps(state)
    out = ckptzip.loads(blob)
    assert torch.equal(out["a.b"], state["a.b"]) and torch.equal(out["a"]["b"], state["a"]["b"])
    with ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob)) as ckpt:
        assert ckpt.keys() == ["a.b", "a.b#2", "(1,x)"]
        assert [leaf.name for leaf in ckpt.leaves] == ["a.b", "a.b#2", "(1,x)"]
        assert torch.equal(ckpt.get_tensor("a.b#2"), state["a"]["b"])


def test_a_header_that_deflates_past_what_a_reader_inflates_is_stored_as_it_is() -> None:
    """A list of a million zeros (or a long repetitive metadata string) deflated past the
    reader's bound on a header's expansion: the save succeeded and the load refused the file as
    hostile. Such a header is stored undeflated."""
    state = {"w": torch.ones(2), "mask": [0] * 1_000_000}
    blob = ckptzip.dumps(state, metadata={"log": "x" * 3_000_000})
    loaded = ckptzip.loads(blob)
    assert loaded["mask"] == state["mask"]
    with ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob)) as checkpoint:
        assert checkpoint.metadata["log"] == "x" * 3_000_000


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd")
def test_a_checkpoint_dropped_unclosed_gives_its_descriptor_back(tmp_path) -> None:
    """``ckptzip.open(p).metadata`` in a loop kept every file's descriptor open until the
    process ran out of them (and saves failed too). A dropped checkpoint is closed when
    collected, with a ResourceWarning, as a Python file object is."""
    import gc

    path = tmp_path / "step.ckz"
    ckptzip.save({"w": torch.ones(8)}, path, metadata={"step": 1})
    before = len(os.listdir("/proc/self/fd"))
    with pytest.warns(ResourceWarning, match="unclosed checkpoint"):
        for _ in range(50):
            assert ckptzip.open(path).metadata["step"] == 1
        gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= before + 1


def test_a_closed_checkpoint_says_it_was_closed(tmp_path) -> None:
    """Reading a checkpoint after close() (another thread still at it) said "read error ...
    Bad file descriptor; check the disk"."""
    path = tmp_path / "a.ckz"
    ckptzip.save({"w": torch.ones(8)}, path)
    checkpoint = ckptzip.open(path)
    checkpoint.close()
    with pytest.raises(ckptzip.Error, match="the checkpoint was closed"):
        checkpoint.get_tensor("w")


def test_threads_false_is_not_every_core() -> None:
    """``threads=False`` equals 0, which means every core: it was taken as that, silently."""
    for bad in (False, True):
        with pytest.raises(ckptzip.ConfigError, match="threads must be"):
            ckptzip.dumps({"w": torch.ones(4)}, threads=bad)
