"""The native passes of the lossy stages (issue 25): nearest-codebook codes, the codebook
look-up, and the dither's shift, each against the torch arithmetic it replaces, and planning on
several threads against one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ckptzip
from ckptzip import _native as N
from ckptzip.codecs import Dither, KMeans, TransformContext
from ckptzip.demo.train import CONFIGS, load_data, make_trainer

CONTEXT = TransformContext("t")


@pytest.fixture(scope="module")
def chain_states():
    """The tiny demo GPT's state after 4 steps and after 4 more (masks, factors: added leaves)."""
    import copy

    trainer = make_trainer(CONFIGS["tiny"], 40, 0)
    train, _ = load_data(CONFIGS["tiny"])
    trainer.train(train, 4)
    first = copy.deepcopy(trainer.state())
    trainer.train(train, 4)
    return first, copy.deepcopy(trainer.state())


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 254), st.integers(0, 5000), st.sampled_from([np.float32, np.float64]),
       st.integers(0, 2**31))
def test_nearest_codes_count_the_thresholds_below(count: int, n: int, dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    thresholds = np.sort(rng.standard_normal(count))
    values = rng.standard_normal(n).astype(dtype)
    values[rng.random(n) < 0.2] = 0.0
    if n and count:
        values[: min(n, count)] = thresholds[: min(n, count)]  # ties: a threshold is not below itself
    codes = np.empty(n, dtype=np.uint8)
    N.nearest_codes(values, thresholds, codes, values.itemsize)
    expected = np.where(values == 0, 0, 1 + np.searchsorted(thresholds, values.astype(np.float64),
                                                            side="left"))
    assert np.array_equal(codes, expected)


def test_nearest_codes_refuse_bad_arguments() -> None:
    values = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError, match="elem_size"):
        N.nearest_codes(values, np.zeros(1), np.empty(4, np.uint8), 2)
    with pytest.raises(ValueError, match="at most 254"):
        N.nearest_codes(values, np.zeros(255), np.empty(4, np.uint8), 4)
    with pytest.raises(ValueError, match="codes for"):
        N.nearest_codes(values, np.zeros(3), np.empty(3, np.uint8), 4)


@pytest.mark.parametrize("elem_size", [4, 8])
def test_table_lookup_decodes_and_names_the_first_bad_code(elem_size: int) -> None:
    table = np.linspace(-1, 1, 17)
    codes = np.arange(10_000, dtype=np.uint64).astype(np.uint8) % 17
    out = np.empty(codes.size, dtype=np.float32 if elem_size == 4 else np.float64)
    assert N.table_lookup(codes, table, out, elem_size) == codes.size
    assert np.array_equal(out, table[codes].astype(out.dtype))
    codes[7321] = 17
    codes[9000] = 200
    assert N.table_lookup(codes, table, out, elem_size) == 7321
    with pytest.raises(ValueError, match="bytes for"):
        N.table_lookup(codes, table, out[:-1], elem_size)


@pytest.mark.parametrize("domain", ["linear", "log"])
def test_kmeans_codes_match_the_torch_search(domain: str) -> None:
    generator = torch.Generator().manual_seed(3)
    values = torch.randn(50_000, generator=generator)
    if domain == "log":
        values = values.abs() + 1e-30
    values[::9] = 0
    quantizer = KMeans(31, "float32", domain)
    codes = quantizer.encode(values, CONTEXT)
    keys = quantizer.table()[1:]
    keys = keys.log() if domain == "log" else keys
    logs = values.double().log() if domain == "log" else values.double()
    expected = torch.where(values == 0, 0, torch.searchsorted((keys[1:] + keys[:-1]) / 2, logs) + 1)
    # the log domain compares exp(midpoint) with the value instead of the midpoint with log(value):
    # the two orders may differ only for a value within rounding of a midpoint
    assert int((codes.long() != expected).sum()) <= (2 if domain == "log" else 0)
    decoded = quantizer.decode(codes, CONTEXT)
    assert torch.equal(decoded, quantizer.table().float()[codes.long()])
    with pytest.raises(ValueError, match="beyond a codebook of 31"):
        quantizer.decode(torch.full((5,), 40, dtype=torch.uint8), CONTEXT)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_dither_shift_is_the_float64_arithmetic_to_the_bit(dtype: torch.dtype) -> None:
    values = torch.randn(100_003, generator=torch.Generator().manual_seed(1)).to(dtype)
    dither = Dither(0xDEADBEEF, 3.7e-3)
    shift = dither.shift(values.shape, values.device)
    wide = torch.promote_types(dtype, torch.float32)
    assert torch.equal(dither.encode(values, CONTEXT), (values.double() + shift).to(wide))
    assert torch.equal(dither.decode(values, CONTEXT), (values.double() - shift).to(wide))
    with pytest.raises(ValueError, match="sign"):
        N.dither_shift(np.ones(3, np.float32), np.ones(3, np.float32), 4, 1, 0.5, 0)


@pytest.mark.parametrize("mode", ["adaptive", "excp", "bitsnap"])
def test_planning_on_threads_makes_the_same_bytes(mode: str, chain_states) -> None:
    """Groups planned on two threads number their added leaves (masks, factors) provisionally
    and take their final indices in order: the file does not depend on the thread count."""
    one = ckptzip.dumps(chain_states[1], mode=mode, base=chain_states[0], threads=1)
    two = ckptzip.dumps(chain_states[1], mode=mode, base=chain_states[0], threads=2)
    assert one == two
    decoded = ckptzip.loads(two, base=chain_states[0])
    assert decoded.keys() == chain_states[1].keys()
    if mode == "adaptive":  # the numbering was exercised: several groups added leaves
        with ckptzip.CheckpointFile(ckptzip.storage.BytesSource(two), base=chain_states[0]) as f:
            added = [leaf.name for leaf in f.leaves if ":" in leaf.name]
        assert len({name.split(":")[0] for name in added}) >= 2, added
