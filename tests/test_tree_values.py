"""Values the state tree must store exactly or refuse at save, naming the key path: tensors with
torch's lazy conjugate / negative bit, nesting at the depth limit, numpy subclasses, strings
UTF-8 cannot encode, ints too long for a header's JSON, nested tensors; big-endian arrays and
NaNs with a sign or payload kept bit for bit."""

from __future__ import annotations

import re
import struct
import sys
import warnings
from collections import OrderedDict
from typing import Any

import numpy as np
import pytest
import torch

import ckptzip
from ckptzip.tree import MAX_DEPTH, MAX_INT_DIGITS


def values(t: torch.Tensor) -> torch.Tensor:
    """A tensor's values with any lazy bit applied, as raw bytes."""
    copy = torch.empty(t.shape, dtype=t.dtype).copy_(t.detach())  # strides (1,) where any
    return copy.resolve_conj().resolve_neg().reshape(-1).view(torch.uint8)


def assert_loads_exactly(state: dict[str, torch.Tensor]) -> None:
    back = ckptzip.loads(ckptzip.dumps(state))
    assert list(back) == list(state)
    for key, tensor in state.items():
        loaded = back[key]
        assert loaded.dtype == tensor.dtype and loaded.shape == tensor.shape, key
        assert torch.equal(values(loaded), values(tensor)), f"{key}: {loaded} != {tensor}"


X = torch.tensor([1 + 2j, 3 - 4j, -5 + 0.5j], dtype=torch.complex64)
W = torch.arange(9, dtype=torch.float64).reshape(3, 3) * (1 - 2j) + 0.25j

LAZY_CASES = {
    "conj beside its source": {"x": X, "x_conj": X.conj()},
    "mH beside its source": {"W": W, "WH": W.mH},
    "neg imag beside real": {"neg_imag": X.conj().imag, "real": X.real},
    "neg imag beside imag": {"neg_imag": X.conj().imag, "imag": X.imag},
    "slices of conj and plain": {"c": X.conj()[1:], "p": X[:2]},
    "slices of neg and plain": {"n": X.conj().imag[::2], "r": X.real[1:], "i": X.imag[:1]},
    "mT of conj beside conj": {"a": W.conj(), "b": W.conj().mT, "c": W.mH.conj()},
}


@pytest.mark.parametrize("reverse", [False, True], ids=["in order", "reversed"])
@pytest.mark.parametrize("case", list(LAZY_CASES))
def test_lazy_conj_and_neg_views_load_with_their_values(case: str, reverse: bool) -> None:
    state = LAZY_CASES[case]
    if reverse:
        state = dict(reversed(state.items()))
    assert_loads_exactly(state)


def test_one_lazy_view_stored_twice_stays_one_tensor() -> None:
    conj = X.conj()
    back = ckptzip.loads(ckptzip.dumps({"a": conj, "b": conj, "x": X}))
    assert back["a"] is back["b"]
    assert torch.equal(values(back["a"]), values(conj)) and torch.equal(back["x"], X)


def nest(leaf: Any, depth: int) -> Any:
    for _ in range(depth):
        leaf = {"k": leaf}
    return leaf


DEPTH_LEAVES: dict[str, Any] = {
    "str": "run-name", "None": None, "True": True, "False": False, "int": 7, "float": 0.5,
    "nan": float("nan"), "tensor": torch.ones(2), "bytes": b"ab", "list": [], "tuple": (),
}


def test_every_leaf_at_the_depth_limit_loads_and_one_deeper_is_refused_at_save() -> None:
    for kind, leaf in DEPTH_LEAVES.items():
        back = ckptzip.loads(ckptzip.dumps(nest(leaf, MAX_DEPTH)))
        for _ in range(MAX_DEPTH):
            back = back["k"]
        if isinstance(leaf, torch.Tensor):
            assert torch.equal(back, leaf), kind
        elif isinstance(leaf, float):
            assert repr(back) == repr(leaf), kind
        else:
            assert back == leaf and type(back) is type(leaf), kind
        with pytest.raises(ckptzip.UnsupportedError, match=r"^k\.k\.k\.k.*deeper than 256"):
            ckptzip.dumps(nest(leaf, MAX_DEPTH + 1))
            pytest.fail(f"a {kind} leaf {MAX_DEPTH + 1} keys deep was saved")


def test_a_none_dict_key_one_level_too_deep_is_refused_at_save() -> None:
    state = nest({None: "x"}, MAX_DEPTH)  # the key node sits one level below its dict
    with pytest.raises(ckptzip.UnsupportedError, match="deeper than 256"):
        ckptzip.dumps(state)


class Tagged(np.ndarray):
    pass


def matrix(rows: list[list[float]]) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PendingDeprecationWarning)  # np.matrix is discouraged
        return np.matrix(rows)


@pytest.mark.parametrize("array", [
    np.ma.masked_array([1.0, -999.0, 3.0], mask=[False, True, False]),
    matrix([[1, 2], [3, 4]]),
    np.arange(4).view(Tagged),
], ids=["masked", "matrix", "own subclass"])
def test_numpy_subclasses_are_refused_naming_the_path(array: np.ndarray) -> None:
    with pytest.raises(ckptzip.UnsupportedError, match=r"^stats\.m: .*ndarray subclass.*np\.asarray"):
        ckptzip.dumps({"stats": {"m": array}, "w": torch.ones(3)})


def test_a_numpy_memmap_is_plain_data_and_loads_as_its_ndarray(tmp_path) -> None:
    mapped = np.memmap(tmp_path / "m.bin", dtype=np.float32, mode="w+", shape=(2, 3))
    mapped[:] = np.arange(6, dtype=np.float32).reshape(2, 3)
    back = ckptzip.loads(ckptzip.dumps({"m": mapped}))
    assert type(back["m"]) is np.ndarray and np.array_equal(back["m"], mapped)
    with pytest.raises(ckptzip.UnsupportedError, match=r"^M: .*numpy\.matrix"):
        ckptzip.dumps({"m": mapped, "M": matrix([[1.0]])})


SURROGATE = b"caf\xe9.bin".decode("utf-8", "surrogateescape")


@pytest.mark.parametrize(("state", "where"), [
    ({"data": {"files": ["ok.bin", SURROGATE]}}, r"data\.files\.1"),
    ({"data": {SURROGATE: 1, "ok": 2}}, r"data\.<key 'caf\\udce9\.bin'>"),
    ({"data": {1: "x", SURROGATE: 2}}, r"data\.<key>"),
    ({"data": {(1, SURROGATE): 2}}, r"data\.<key>\.1"),
    ({"data": OrderedDict(a=1)}, r"data\._metadata\.v"),
], ids=["value", "str key", "mixed key", "tuple key", "metadata"])
def test_strings_utf8_cannot_encode_are_refused_naming_the_path(state: dict, where: str) -> None:
    if isinstance(state["data"], OrderedDict):
        state["data"]._metadata = {"v": SURROGATE}  # type: ignore[attr-defined]
    with pytest.raises(ckptzip.UnsupportedError, match=rf"^{where}: .*surrogate.*os\.fsencode") as info:
        ckptzip.dumps({"w": torch.ones(2), **state})
    str(info.value).encode("utf-8")  # the message itself prints


def test_ints_too_long_for_json_are_refused_and_the_longest_load() -> None:
    longest = 10**MAX_INT_DIGITS - 1
    back = ckptzip.loads(ckptzip.dumps({"a": longest, "b": -longest, "c": {longest: 1}}))
    assert back == {"a": longest, "b": -longest, "c": {longest: 1}}
    for value in (10**MAX_INT_DIGITS, -(10**MAX_INT_DIGITS), 7**6000):
        with pytest.raises(ckptzip.UnsupportedError, match=r"^meta\.seed: .*digits.*to_bytes"):
            ckptzip.dumps({"meta": {"seed": value}})
    with pytest.raises(ckptzip.UnsupportedError, match=r"^meta\.<key>: .*digits"):
        ckptzip.dumps({"meta": {7**6000: 1}})


@pytest.mark.skipif(not hasattr(sys, "set_int_max_str_digits"), reason="no int/str limit")
def test_a_lower_int_str_limit_of_the_process_is_refused_cleanly() -> None:
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        with pytest.raises(ckptzip.UnsupportedError, match=r"^seed: .*more than 1000 digits"):
            ckptzip.dumps({"seed": 10**1500})
    finally:
        sys.set_int_max_str_digits(before)


@pytest.mark.parametrize("layout", [torch.strided, torch.jagged], ids=["strided", "jagged"])
def test_nested_tensors_are_refused_naming_the_path(layout: torch.layout) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the nested tensor API's prototype warning
        nested = torch.nested.nested_tensor([torch.randn(2), torch.randn(3)], layout=layout)
    with pytest.raises(ckptzip.UnsupportedError, match=re.escape("model.nt: a nested tensor") + ".*unbind"):
        ckptzip.dumps({"model": {"nt": nested, "w": torch.ones(2)}})


@pytest.mark.parametrize("mode", ["lossless", "adaptive"])
def test_an_expanded_tensor_stays_a_view_of_what_it_covers(mode: str) -> None:
    """``zeros(1).expand(n)`` was stored whole (a load made n elements of one), and a lossy
    mode coded the copies of one row apart. Stored as the storage it covers, it comes back as
    the same expand: stride 0, every copy one value."""
    generator = torch.Generator().manual_seed(0)
    row = torch.randn(1, 256, generator=generator)
    first = {"rows": row.expand(32, 256), "zeros": torch.zeros(1).expand(1_000_000)}
    second = {"rows": (row + 0.01).expand(32, 256), "zeros": first["zeros"]}
    for state, base in ((first, None), (second, first)):
        decoded = ckptzip.loads(ckptzip.dumps(state, mode=mode, base=base), base=base)
        assert decoded["zeros"].stride() == (0,) and decoded["zeros"].untyped_storage().nbytes() == 4
        assert decoded["rows"].stride() == (0, 1) and decoded["rows"].shape == (32, 256)
        assert bool((decoded["rows"] == decoded["rows"][0]).all())
    assert torch.allclose(decoded["rows"][0], second["rows"][0], atol=0.02)


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">c8", ">f2", ">u2"])
def test_a_big_endian_array_loads_with_its_dtype_and_bytes(tmp_path, dtype: str) -> None:
    array = (np.arange(6) * 3 - 5).astype(dtype).reshape(2, 3)
    state = {"a": array, "same": array, "little": array.astype(array.dtype.newbyteorder("<"))}
    path = tmp_path / "be.ckz"
    ckptzip.save(state, path)
    back = ckptzip.load(path)
    for key in state:
        assert back[key].dtype == state[key].dtype, key  # '>f4' != '<f4' in numpy
        assert back[key].tobytes() == state[key].tobytes() and back[key].shape == (2, 3), key
    with ckptzip.open(path) as f:
        f.verify()


def bits(value: float) -> bytes:
    return struct.pack("<d", value)


NAN_PAYLOAD = struct.unpack("<d", bytes.fromhex("230100000000f87f"))[0]


def test_python_nans_keep_their_sign_and_payload() -> None:
    state = {"neg": -float("nan"), "payload": NAN_PAYLOAD, "plain": float("nan"),
             "in": [complex(NAN_PAYLOAD, -float("nan")), float("inf")]}
    back = ckptzip.loads(ckptzip.dumps(state))
    assert bits(back["neg"]) == bits(-float("nan")) != bits(float("nan"))
    assert bits(back["payload"]) == bits(NAN_PAYLOAD)
    assert bits(back["plain"]) == bits(float("nan"))
    assert bits(back["in"][0].real) == bits(NAN_PAYLOAD)
    assert bits(back["in"][0].imag) == bits(-float("nan")) and back["in"][1] == float("inf")


@pytest.mark.parametrize(("node", "message"), [
    ({"t": "float", "v": "nan", "bits": "000000000000f03f"}, "not a NaN"),
    ({"t": "float", "v": "inf", "bits": "000000000000f87f"}, "16 lowercase hex"),
    ({"t": "float", "v": "nan", "bits": "f87f"}, "16 lowercase hex"),
    ({"t": "ndarray", "i": 0, "bo": "<"}, "byte order"),
    ({"t": "ndarray", "i": 1, "bo": ">"}, "byte order"),
])
def test_a_header_with_bad_nan_bits_or_byte_order_is_refused(node: dict, message: str) -> None:
    from ckptzip.tree import check_tree, unflatten
    leaves = [(torch.float32, (2,)), (torch.uint8, (2,))]
    with pytest.raises(ckptzip.FormatError, match=message):
        check_tree({"t": "list", "v": [node]}, leaves)
    tensors = [torch.zeros(2), torch.zeros(2, dtype=torch.uint8)]
    with pytest.raises(ckptzip.FormatError, match=message):
        unflatten({"t": "list", "v": [node]}, tensors.__getitem__, len(tensors))
