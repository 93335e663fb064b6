"""The native passes of the lossy stages (issue 25): nearest-codebook codes, the codebook
look-up, and the dither's shift, each against the torch arithmetic it replaces, and planning on
several threads against one."""

from __future__ import annotations

import os
import subprocess
import sys

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


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 15, 17, 1001])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sum_squares_of_every_length(n: int, dtype: type) -> None:
    """Eight accumulators and a tail: every length sums each element once (the tail once read
    past the end: fuzz_quantize found it)."""
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n).astype(dtype), rng.standard_normal(n).astype(dtype)
    squares = float((a.astype(np.float64) ** 2).sum())
    assert N.sum_squares(a, None, a.itemsize) == pytest.approx(squares, rel=1e-12)
    difference = (a - b).astype(np.float64)  # taken in the element type, as the kernel does
    assert N.sum_squares(a, b, a.itemsize) == pytest.approx(float((difference ** 2).sum()), rel=1e-12)


@pytest.mark.parametrize("levels", [1023, 0])
@pytest.mark.parametrize("piece", [1 << 21, 4096])
def test_uniform_table_native_and_torch_agree(levels: int, piece: int, monkeypatch) -> None:
    """The native bins and torch's ops (levels beyond NATIVE_LEVELS; a device's path, in pieces
    of hostpath.TORCH_PIECE elements) give the same table and the same pruned values."""
    from ckptzip import hostpath
    from ckptzip.modes import quantize

    values = torch.randn(30_001, generator=torch.Generator().manual_seed(2)) ** 3
    native, table = quantize.uniform_table(values, 0.37, 0.35)
    monkeypatch.setattr(quantize, "NATIVE_LEVELS", levels)
    monkeypatch.setattr(hostpath, "TORCH_PIECE", piece)
    other, other_table = quantize.uniform_table(values, 0.37, 0.35)
    assert torch.equal(native.abs(), other.abs()) and np.allclose(table, other_table, rtol=1e-12)
    assert bool(((native == values) | (native == 0)).all())


def _sparse_values(n: int, seed: int) -> torch.Tensor:
    """float32 values over float's whole range: normals of every exponent, float subnormals,
    values fp16 rounds to zero or to its subnormals, zeros of both signs."""
    generator = torch.Generator().manual_seed(seed)
    exponents = torch.randint(-140, 120, (n,), generator=generator).double()
    values = (torch.randn(n, generator=generator, dtype=torch.float64) * 2.0**exponents).float()
    values[torch.rand(n, generator=generator) < 0.4] = 0.0
    values[::13] = -0.0
    return values


@pytest.mark.parametrize(("n", "spread"), [(0, 1), (1, 1), (7, 1), (8, 1), (100_003, 1),
                                           (100_003, 0), (4_099, 0)])
def test_sparse_native_and_torch_write_and_read_the_same_bytes(n: int, spread: int,
                                                               monkeypatch) -> None:
    from ckptzip.codecs import Sparse

    values = _sparse_values(n, n) if spread else torch.randn(n) * 1e-3
    native = Sparse("bitmask", "float32", [n])
    native_bytes = native.encode(values, CONTEXT)
    native_decoded = native.decode(native_bytes, CONTEXT)
    monkeypatch.setattr(Sparse, "_on_native", lambda self, device: False)
    # torch's path takes the values a piece at a time: many pieces here, of a size the mask's
    # bytes do not divide
    from ckptzip import hostpath
    monkeypatch.setattr(hostpath, "TORCH_PIECE", 997)
    other = Sparse("bitmask", "float32", [n])
    torch_bytes = other.encode(values, CONTEXT)
    assert (native.count, native.scale_exp) == (other.count, other.scale_exp)
    assert torch.equal(native_bytes, torch_bytes)
    torch_decoded = other.decode(torch_bytes, CONTEXT)
    assert torch.equal(native_decoded.view(torch.int32), torch_decoded.view(torch.int32))


def test_fp16_rounding_is_torchs_on_every_kind_of_float() -> None:
    """float -> fp16 (round to nearest even, fp16's subnormals, overflow to infinity) on random
    bit patterns, and fp16 -> float on every finite pattern, against torch's conversions."""
    bits = torch.randint(-2**31, 2**31 - 1, (1_000_000,), dtype=torch.int64,
                         generator=torch.Generator().manual_seed(5)).to(torch.int32)
    floats = bits.view(torch.float32)
    floats = floats[torch.isfinite(floats) & (floats != 0)]
    floats = torch.cat([floats, floats * 2.0**-100, floats * 2.0**100])  # fp16's range
    floats = floats[torch.isfinite(floats) & (floats != 0)]
    n = floats.numel()
    count, _ = N.sparse_survey(floats.numpy())
    packed = np.empty((n + 7) // 8 + 2 * n, dtype=np.uint8)
    assert count == n and N.sparse_pack(floats.numpy(), 0, packed) == n
    lo, hi = packed[(n + 7) // 8:][:n], packed[(n + 7) // 8:][n:]
    expected = floats.double().half().view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(lo.astype(np.uint16) | hi.astype(np.uint16) << 8, expected)
    halves = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16)
    halves = halves[torch.isfinite(halves) & (halves != 0)]
    m = halves.numel()
    patterns = halves.view(torch.int16).numpy().view(np.uint16)
    mask = np.full((m + 7) // 8, 255, dtype=np.uint8)
    if m % 8:
        mask[-1] = (1 << (m % 8)) - 1
    src = np.concatenate([mask, (patterns & 255).astype(np.uint8), (patterns >> 8).astype(np.uint8)])
    out = np.empty(m, dtype=np.float32)
    assert N.sparse_unpack(src, m, 0, out)
    assert np.array_equal(out.view(np.uint32), halves.float().numpy().view(np.uint32))


def test_sparse_unpack_refuses_a_mask_that_is_not_the_count() -> None:
    from ckptzip.codecs import Sparse

    values = torch.zeros(13)
    values[[0, 5, 12]] = torch.tensor([1.0, -2.0, 3.0])
    stage = Sparse("bitmask", "float32", [13])
    data = stage.encode(values, CONTEXT)
    assert torch.equal(stage.decode(data, CONTEXT), values)
    beyond = data.clone()
    beyond[1] |= 1 << 6  # element 14 of 13
    extra = data.clone()
    extra[0] |= 1 << 3  # a fourth element where three values are stored
    fewer = data.clone()
    fewer[0] &= 0xFE
    for bad in (beyond, extra, fewer):
        with pytest.raises(ValueError, match="does not mark exactly 3"):
            stage.decode(bad, CONTEXT)
    with pytest.raises(ValueError, match=r"bad count|not a"):
        N.sparse_unpack(data.numpy(), 4, 0, np.empty(13, dtype=np.float32))
    with pytest.raises(ValueError, match="more than 2 non-zeros"):
        N.sparse_pack(values.numpy(), 0, np.empty(2 + 4, dtype=np.uint8))
    with pytest.raises(ckptzip.Error):
        Sparse("bitmask", "float32", [13], 3, 5000)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compact_nonzero_is_the_boolean_index(dtype: torch.dtype) -> None:
    from ckptzip.codecs.kmeans import nonzero_values

    values = torch.randn(10_001, generator=torch.Generator().manual_seed(4)).to(dtype)
    values[values.abs() < 0.7] = 0
    values[::11] = -0.0
    values[::101] = float("nan")
    got, expected = nonzero_values(values), values[values != 0]
    assert got.numel() == expected.numel()
    assert torch.equal(got.view(torch.uint8) if dtype == torch.float64 else got.view(torch.int32),
                       expected.view(torch.uint8) if dtype == torch.float64
                       else expected.view(torch.int32))


def _moments(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Second-moment-like float32 values over 30 decades, a fifth of them zero, and a base that
    differs from them by a common factor and noise, with a few of its own zeros."""
    generator = torch.Generator().manual_seed(seed)
    v = torch.exp(torch.empty(n).uniform_(-69, 0, generator=generator)).float()
    v[torch.rand(n, generator=generator) < 0.2] = 0
    base = (v * 0.97 * torch.exp(0.1 * torch.randn(n, generator=generator))).float()
    base[(v == 0) & (torch.rand(n, generator=generator) < 0.5)] = 0
    return v, base


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 65_537])
def test_base_ratios_native_and_torch_agree_to_the_bit(n: int) -> None:
    from ckptzip.codecs.base_ratio import base_ratios

    v, base = _moments(n, n)
    native = base_ratios(v, base)
    torch_way = torch.where(v == 0, 0.0, v.double() / base.double())
    assert native is not None and native.dtype == torch.float64
    assert torch.equal(native, torch_way)
    # a base without a ratio under a non-zero element refuses; under a zero one it is fine
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        if n:
            spoiled = base.clone()
            spoiled[v == 0] = bad
            assert base_ratios(v, spoiled) is not None
            nonzero = int(torch.nonzero(v)[0]) if bool((v != 0).any()) else None
            if nonzero is not None:
                spoiled[nonzero] = bad
                assert base_ratios(v, spoiled) is None


@pytest.mark.parametrize("ratio_dtype", [torch.float32, torch.float64])
def test_ratio_restore_is_the_float64_product_rounded_once(ratio_dtype: torch.dtype) -> None:
    from ckptzip.codecs import BaseRatio

    v, base = _moments(10_001, 3)
    ratios = torch.where(v == 0, 0.0, v.double() / torch.where(base > 0, base, 1.0).double())
    ratios = ratios.to(ratio_dtype)
    context = TransformContext("v", base=base)
    decoded = BaseRatio("float32").decode(ratios, context)
    product = (base.double() * ratios.double()).float()
    expected = torch.where(ratios == 0, torch.zeros_like(product), product)
    assert decoded.dtype == torch.float32 and torch.equal(decoded, expected)
    assert torch.equal(torch.signbit(decoded), torch.signbit(expected))
    with pytest.raises(ValueError, match="ratios"):
        N.ratio_restore(ratios.numpy()[:-1], ratios.element_size(), base.numpy(),
                        torch.empty(base.numel()).float().numpy())


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 65_537])
def test_step_quotients_and_restore_native_and_torch_agree_to_the_bit(n: int) -> None:
    """The sqrt-scale stage's two passes, native on the host, are torch's float64 arithmetic (a
    device's path) to the bit, and both refuse what they cannot code or decode."""
    from ckptzip.codecs import SqrtScale
    from ckptzip.codecs.sqrt_scale import step_quotients
    from ckptzip.hostpath import torch_ops_only

    v, _ = _moments(n, n + 11)
    generator = torch.Generator().manual_seed(n)
    m = torch.where(v > 0, torch.randn(n, generator=generator) * v.sqrt(), 0.0).float()
    native = step_quotients(m, v)
    with torch_ops_only():
        torch_way = step_quotients(m, v)
    assert native is not None and torch_way is not None and native.dtype == torch.float32
    assert torch.equal(native, (m.double() / torch.from_numpy(np.sqrt(v.double().numpy()))).float()
                       .where(m != 0, 0.0))
    assert torch.equal(native, torch_way)
    stage, context = SqrtScale(0, "float32"), TransformContext("m", siblings={0: v})
    for steps in (native, native.double()):
        decoded = stage.decode(steps, context)
        with torch_ops_only():
            assert torch.equal(decoded, stage.decode(steps, context))
        product = (steps.double() * v.double().sqrt()).float()
        assert torch.equal(decoded, torch.where(steps == 0, torch.zeros_like(product), product))
    if not bool((m != 0).any()):
        return
    nonzero = int(torch.nonzero(m)[0])
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        spoiled = v.clone()
        spoiled[m == 0] = bad  # under a zero moment any scale will do
        assert step_quotients(m, spoiled) is not None
        spoiled[nonzero] = bad
        assert step_quotients(m, spoiled) is None
        with torch_ops_only():
            assert step_quotients(m, spoiled) is None
        if bad != 0.0:  # a zero scale decodes to zero; a negative or non-finite one is damage
            damaged = TransformContext("m", siblings={0: spoiled})
            with pytest.raises(ValueError, match="negative or not finite"):
                stage.decode(native, damaged)
            with torch_ops_only(), pytest.raises(ValueError, match="negative or not finite"):
                stage.decode(native, damaged)


@pytest.mark.parametrize("n", [0, 5, 8, 13, 4096, 100_003])
def test_sqrt_error_is_ieee_float32_summed_as_sum_squares(n: int) -> None:
    """Each term is IEEE float32 arithmetic, correctly rounded (numpy's), its squares summed as
    sum_squares sums them; torch's expression (whose square root on AVX-512 can be an ulp off)
    agrees to float32's precision."""
    from ckptzip.modes.adaptive import decoded_sqrt_error_norm
    from ckptzip.modes.common import magnitude

    v, base = _moments(n, 7 + n)
    decoded = torch.where(v > 0, base, 0.0)  # decoded values off by a factor, some zero
    positive = v > 0
    x = np.where(positive.numpy(), v.numpy(), np.float32(1))
    y = np.where(positive.numpy(), decoded.numpy(), np.float32(1))
    terms = (y - x) / (x * (np.sqrt(y / x) + np.float32(1)))
    assert terms.dtype == np.float32
    expected = np.sqrt(N.sum_squares(np.ascontiguousarray(terms), None, 4))
    assert decoded_sqrt_error_norm(v, decoded) == expected
    stored, restored = torch.where(positive, v, 1.0), torch.where(positive, decoded, 1.0)
    torch_way = magnitude((restored - stored) / (stored * ((restored / stored).sqrt() + 1)))
    assert decoded_sqrt_error_norm(v, decoded) == pytest.approx(torch_way, rel=1e-6)
    with pytest.raises(ValueError, match="float32"):
        N.sqrt_error_squares(v.numpy(), np.zeros(n + 1, np.float32))


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 65_537])
def test_residual_add_and_keep_changed_are_torchs_to_the_bit(n: int) -> None:
    """The lossy-residual stage's decoding (the base's own bits where the difference is zero,
    -0.0 included, else the float32 sum) and the zeros stage's masking (+0.0 where the packed
    mask says unchanged, most significant bit first), natively as torch computes them."""
    from ckptzip.codecs import ExactZeros, LossyResidual
    from ckptzip.codecs.zeros import pack_changed

    generator = torch.Generator().manual_seed(n)
    base = torch.randn(n, generator=generator)
    base[::5] = -0.0
    delta = torch.randn(n, generator=generator) * 1e-3
    delta[::3] = 0.0
    delta[1::7] = -0.0
    delta[2::11] = -base[2::11]  # sums to zero
    context = TransformContext("w", base=base)
    decoded = LossyResidual("float32").decode(delta, context)
    expected = torch.where(delta == 0, base, base + delta)
    assert torch.equal(decoded.view(torch.int32), expected.view(torch.int32))  # signs of zeros too
    changed = torch.rand(n, generator=generator) < 0.6
    packed = pack_changed(changed)
    stage = ExactZeros(0)
    masked = stage.decode(delta, TransformContext("w", siblings={0: packed}))
    assert torch.equal(masked.view(torch.int32), delta.masked_fill(~changed, 0).view(torch.int32))
    with pytest.raises(ValueError, match="mask"):
        N.keep_changed(delta.numpy(), np.zeros(n // 8 + 2, np.uint8), np.zeros(n, np.float32))
    with pytest.raises(ValueError, match="change mask holds"):  # the wrong size: the torch path's error
        stage.decode(delta, TransformContext("w", siblings={0: torch.zeros(n // 8 + 2, dtype=torch.uint8)}))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 5000), st.floats(1e-3, 10.0), st.integers(0, 2**31))
def test_rounding_spread_is_unbiased_roundings_expected_error(n: int, step: float,
                                                             seed: int) -> None:
    """The native sums the step bisection reads: sum f (1 - f) and sum f (1 - f) (1 - 2 f)^2 of
    the fractions of |x| / step, against numpy in float64."""
    x = (np.random.default_rng(seed).standard_t(3, n) * 2).astype(np.float32)
    scaled = np.abs(x.astype(np.float64)) / step
    f = scaled - np.floor(scaled)
    mean, spread = N.rounding_spread(x, step)
    assert mean == pytest.approx(float((f * (1 - f)).sum()), rel=1e-9, abs=1e-9)
    assert spread == pytest.approx(float((f * (1 - f) * (1 - 2 * f) ** 2).sum()), rel=1e-9,
                                   abs=1e-9)


def python_step_bisect(magnitudes: np.ndarray, fraction: float, sigmas: float, target: float,
                       fine: float, coarse: float, tolerance: float, rounds: int) -> float:
    """The Python bisection the native one replaced (session 34), as factoring.py had it."""
    import math

    def error(step: float) -> float:
        mean, spread = N.rounding_spread(magnitudes, step)
        return mean * step * step + sigmas * math.sqrt(spread * fraction) * step * step

    for _ in range(rounds):
        if coarse <= fine * (1 + tolerance):
            break
        middle = math.sqrt(fine * coarse)
        if error(middle) <= target:
            fine = middle
        else:
            coarse = middle
    return fine


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70_000), st.sampled_from([0.0, 1.0, 2.0]), st.floats(1e-4, 0.9),
       st.integers(0, 2**31))
def test_step_bisect_is_the_python_bisection_to_the_bit(n: int, sigmas: float, budget: float,
                                                        seed: int) -> None:
    """The unbiased step's bisection in one native call ends on the very step the Python loop
    did (its rounds call the same native sums and do the same float arithmetic in order)."""
    import math

    from ckptzip.modes import factoring

    rng = np.random.default_rng(seed)
    magnitudes = np.abs(rng.standard_t(3, n) * 1e-3).astype(np.float32)
    top = float(magnitudes.max())
    target = budget * budget * float((magnitudes.astype(np.float64) ** 2).sum())
    if not (top > 0 and target > 0):
        return
    fine = min(math.sqrt(target / (n / 4)), top)
    args = (magnitudes, 0.5, sigmas, target, fine, top, factoring.STEP_TOLERANCE,
            factoring.STEP_ROUNDS)
    assert N.step_bisect(*args) == python_step_bisect(*args)
    with pytest.raises(ValueError, match="fine > 0"):
        N.step_bisect(magnitudes, 0.5, sigmas, target, 0.0, top, 1e-3, 32)


def test_level_bits_is_the_expected_entropy_of_a_draw() -> None:
    """The levels' expected entropy (the rank search and the choice of rounding read it) is the
    entropy of the expected histogram, which a stochastic draw's and a dither's levels both come
    within a fraction of a percent of; it gives up (-1) beyond its level limit, or on a value that
    is not finite."""
    from ckptzip.modes.factoring import Rounding, dithered_levels, unbiased_levels
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(200_000, generator=generator) * 0.7
    for step in (0.05, 0.4, 3.0):
        expected = N.level_bits(x.numpy(), step, 1 << 16)
        for levels in (unbiased_levels(x, step, 9), dithered_levels(x, step, 9)):
            assert Rounding(levels, step, False).bits == pytest.approx(expected, rel=0.005)
    # by hand: 0.25 of a step lands on level 1 a quarter of the time
    bits = N.level_bits(np.array([0.25, 0.25, 2.0, 2.0], dtype=np.float32), 1.0, 8)
    hist = np.array([1.5, 0.5, 2.0])
    assert bits == pytest.approx(float(-(hist * np.log2(hist / 4)).sum()))
    assert N.level_bits(np.array([0.0, 1000.0], dtype=np.float32), 1.0, 100) == -1.0
    assert N.level_bits(np.array([0.0, np.nan], dtype=np.float32), 1.0, 100) == -1.0
    assert N.level_bits(np.zeros(0, dtype=np.float32), 1.0, 100) == 0.0


def numpy_uniform_candidate(sample: np.ndarray, step: float, offset: float,
                            levels: int) -> tuple[int, int, float, float]:
    """The numpy arithmetic the native candidate replaced (session 18)."""
    from ckptzip.modes.quantize import entropy_bits
    sums = np.concatenate([[0.0], np.cumsum(sample)])
    squares = np.concatenate([[0.0], np.cumsum(sample * sample)])
    inner = (np.arange(1, levels + 1) - offset) * step
    edges = np.searchsorted(sample, np.concatenate([-inner[::-1], inner]))
    edges = np.concatenate([[0], edges, [sample.size]])
    counts = np.diff(edges)
    s1, s2 = sums[edges[1:]] - sums[edges[:-1]], squares[edges[1:]] - squares[edges[:-1]]
    sse = s2 - s1 * s1 / np.maximum(counts, 1)
    sse[levels] = s2[levels]
    return (int(counts[levels]), int((counts > 0).sum() - (counts[levels] > 0)),
            entropy_bits(counts), float(sse.sum()))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 70_000), st.sampled_from([0.5, 0.35, 0.2]), st.floats(0.01, 8.0),
       st.integers(0, 2**31))
def test_uniform_candidate_is_the_numpy_search_step(n: int, offset: float, relative_step: float,
                                                    seed: int) -> None:
    """The uniform quantizer's candidates (the adaptive search's most frequent step) read the
    same bins, error and entropy as the numpy code they replaced."""
    rng = np.random.default_rng(seed)
    sample = np.sort(rng.standard_t(3, n) * 1e-3)
    rms = float(np.sqrt(np.mean(sample * sample))) if n else 1.0
    step = relative_step * rms
    top = float(np.abs(sample).max()) if n else 0.0
    levels = int(np.floor(top / step + offset))
    if 2 * levels > 255:
        return
    sums = np.concatenate([[0.0], np.cumsum(sample)])
    squares = np.concatenate([[0.0], np.cumsum(sample * sample)])
    zero, used, bits, sse = N.uniform_candidate(sample, sums, squares, step, offset, levels)
    expected = numpy_uniform_candidate(sample, step, offset, levels)
    assert (zero, used) == expected[:2]
    assert bits == pytest.approx(expected[2], rel=1e-12, abs=1e-9)
    assert sse == pytest.approx(expected[3], rel=1e-12, abs=1e-30)
    with pytest.raises(ValueError):
        N.uniform_candidate(sample, sums[:-1], squares, step, offset, levels)


_SEARCH_SIZES = [0, 1, 2, 3, 7, 64, 384, 1000, 5000, 70_000, 1 << 17]
_SEARCH_KINDS = ["normal", "heavy tails", "mostly zero", "tiny positive", "constant", "few values",
                 "negative"]


def _search_values(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal(n)
    if kind == "heavy tails":
        x = rng.standard_t(2, n)
    elif kind == "mostly zero":
        x[rng.random(n) < 0.7] = 0.0
    elif kind == "tiny positive":
        x = np.abs(x) * 1e-8
    elif kind == "constant":
        x = np.full(n, 0.25)
    elif kind == "few values":
        x = np.round(x * 4) / 4
    elif kind == "negative":
        x = -np.abs(x) * 1e3
    return x.astype(np.float32)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(_SEARCH_SIZES), st.sampled_from(_SEARCH_KINDS),
       st.sampled_from([0.0, 0.005, 0.05, 0.1, 0.3, 0.7, 1.5]), st.sampled_from([1.0, 0.3, 3.0]),
       st.booleans(), st.integers(0, 2**31))
def test_native_search_is_the_python_search_to_the_bit(n: int, kind: str, budget: float,
                                                       energy_scale: float, kmeans: bool,
                                                       seed: int) -> None:
    """The whole budgeted search in one native call picks what the torch and numpy search
    picks: the same kept count, codebook, step and offset, and the same bits and error to the
    last bit (a different estimate could tip a later choice and change a file)."""
    from ckptzip.modes import quantize

    ordered = quantize.ascending(torch.from_numpy(_search_values(kind, n, np.random.default_rng(seed))))
    scale_sq = max(float((ordered * ordered).sum()) * energy_scale, 1e-300)
    native = quantize._native_search(ordered, scale_sq, budget, kmeans)
    assert native is not None
    assert native == quantize._search_sorted(ordered, scale_sq, budget, kmeans)


def test_native_search_leaves_what_it_does_not_take_to_python() -> None:
    """A value that is not finite (the modes store such a tensor exactly, unsearched), a budget
    that is not a number or a zero scale: the native search declines (None), and ``search``
    runs Python's (its callers pass a scale of at least 1e-300)."""
    from ckptzip.modes import quantize

    values = torch.tensor([-1.0, 0.5, 2.0, float("inf")])
    ordered = quantize.ascending(values)
    assert quantize._native_search(ordered, 1.0, 0.1, True) is None
    finite = quantize.ascending(values[:3])
    assert quantize._native_search(finite, 1.0, float("nan"), True) is None
    assert quantize._native_search(finite, 0.0, 0.1, True) is None
    with pytest.raises(ValueError, match="8-byte"):
        N.quantize_search(np.zeros(3, np.float32), 1.0, 0.1, True, quantize._FRACTIONS,
                          quantize._CODEBOOKS, quantize._OFFSETS, 8.0, 0.02, 14, 1 << 16, 40)


@pytest.mark.parametrize("bad", ["fraction", "codebook", "offset", "steps", "bisections"])
def test_native_search_refuses_a_bad_spec(bad: str) -> None:
    """A kept fraction above 1 would read past the values' running sums: the binding refuses
    every spec the search cannot keep in bounds, before it reads a value."""
    from ckptzip.modes import quantize

    spec = dict(fractions=quantize._FRACTIONS, codebooks=quantize._CODEBOOKS,
                offsets=quantize._OFFSETS, coarsest=8.0, finest=0.02, bisections=14)
    spec.update({"fraction": {"fractions": np.array([1.5])},
                 "codebook": {"codebooks": np.array([0], dtype=np.int64)},
                 "offset": {"offsets": np.array([1.0])},
                 "steps": {"finest": 9.0},
                 "bisections": {"bisections": 65}}[bad])
    with pytest.raises(ValueError, match="fractions must be in"):
        N.quantize_search(np.linspace(-1, 1, 100), 1.0, 0.1, True, spec["fractions"],
                          spec["codebooks"], spec["offsets"], spec["coarsest"], spec["finest"],
                          spec["bisections"], 1 << 16, 40)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 20_000), st.sampled_from([torch.float32, torch.float64]),
       st.floats(1e-4, 0.05), st.booleans(), st.integers(0, 2**32 - 1))
def test_round_levels_draws_torchs_levels(n: int, dtype: torch.dtype, step: float,
                                          dithered: bool, seed: int) -> None:
    """The native unbiased rounding (one pass, int8 levels and their histogram) draws exactly
    the levels of the torch arithmetic it replaced on the host, both ways; a level beyond 127
    makes it give up (-1), and the torch levels are drawn instead."""
    from ckptzip.modes.factoring import (
        STOCHASTIC_SEED_KEY,
        _drawn,
        dithered_levels,
        unbiased_levels,
    )
    x = (torch.randn(n, generator=torch.Generator().manual_seed(seed % 1000)) * 0.01).to(dtype)
    levels = torch.empty(n, dtype=torch.int8)
    counts = np.zeros(255, dtype=np.uint64)
    top = N.round_levels(x.numpy(), levels.numpy(), counts, x.element_size(), step,
                         seed if dithered else seed ^ STOCHASTIC_SEED_KEY, dithered)
    expected = (dithered_levels if dithered else unbiased_levels)(x, step, seed)
    biggest = int(expected.abs().max()) if n else 0
    if biggest > 127:
        assert top == -1
        assert _drawn(x, step, dithered, seed).counts is None  # torch's levels instead
        return
    assert top == biggest
    assert torch.equal(levels.long(), expected)
    assert np.array_equal(counts, np.bincount((expected + 127).numpy(), minlength=255))
    rounding = _drawn(x, step, dithered, seed)
    codes = rounding.codes()
    assert codes is not None and codes.dtype == torch.uint8
    used = np.flatnonzero(counts) - 127
    used = used[used != 0]
    table = np.concatenate([[0], used])  # code -> level
    assert np.array_equal(table[codes.numpy()], expected.numpy())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 5000), st.sampled_from([np.float32, np.float64]), st.integers(0, 2**31))
def test_sort_floats_is_numpys_order(n: int, dtype: type, seed: int) -> None:
    """The radix sort gives numpy's sorted values over every float: both signs of zero, the
    infinities, subnormals and magnitudes from 1e-30 to 1e30; NaN is left to numpy."""
    rng = np.random.default_rng(seed)
    values = (rng.standard_normal(n) * 10.0 ** rng.integers(-30, 30, n)).astype(dtype)
    values[rng.random(n) < 0.1] = 0.0
    values[rng.random(n) < 0.05] = -0.0
    values[rng.random(n) < 0.01] = np.inf
    values[rng.random(n) < 0.01] = -np.inf
    values[rng.random(n) < 0.01] = np.finfo(dtype).smallest_subnormal
    ordered = values.copy()
    assert N.sort_floats(ordered, ordered.itemsize)
    assert np.array_equal(ordered, np.sort(values))
    if n:
        values[n // 2] = np.nan
        kept = values.copy()
        assert not N.sort_floats(values, values.itemsize)  # untouched: numpy sorts NaN last
        assert np.array_equal(values, kept, equal_nan=True)
        from ckptzip.codecs.kmeans import sorted_floats

        assert np.array_equal(sorted_floats(values), np.sort(values), equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3000), st.integers(0, 2**31))
def test_descending_magnitudes_is_the_stable_sorts_merge(n: int, seed: int) -> None:
    """The native merge of the negatives' and the rest's runs gives the bits of the stable sort
    it replaced (modes/quantize.py descending_magnitudes), zeros of both signs included."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(n) * 10.0 ** rng.integers(-5, 5, n)
    values[rng.random(n) < 0.1] = 0.0
    values[rng.random(n) < 0.05] = -0.0
    values[rng.random(n) < 0.02] = 1.5  # ties across the runs
    values[rng.random(n) < 0.02] = -1.5
    ordered = np.sort(values)
    split = int(np.searchsorted(ordered, 0.0))
    expected = np.sort(np.concatenate([-ordered[:split][::-1], np.abs(ordered[split:])]),
                       kind="stable")[::-1]
    merged = np.empty_like(ordered)
    assert N.descending_magnitudes(ordered, merged)
    assert np.array_equal(merged.view(np.uint64), expected.view(np.uint64))
    if n:
        ordered[-1] = np.nan
        assert not N.descending_magnitudes(ordered, merged)
    with pytest.raises(ValueError, match="out holds"):
        N.descending_magnitudes(ordered, np.empty(n + 1))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 3000), st.sampled_from([torch.float32, torch.float64]), st.integers(0, 2**31))
def test_support_native_passes_are_the_boolean_index(n: int, dtype: torch.dtype, seed: int) -> None:
    """The support stage's native gather and scatter store and decode what torch's boolean
    indexing does (a device's path), and refuse a value outside the support or a count that is
    not the support's."""
    from ckptzip import hostpath
    from ckptzip.codecs import Support
    from ckptzip.errors import ConfigError

    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(n, generator=generator) < 0.4
    values = torch.randn(n, generator=generator, dtype=dtype) * mask
    context = TransformContext("t", support=mask)
    stage = Support(0)
    stored = stage.encode(values, context)
    with hostpath.torch_ops_only():
        assert torch.equal(stage.encode(values, context), stored)
        by_torch = stage.decode(stored, context)
    decoded = stage.decode(stored, context)
    assert decoded.dtype == dtype and torch.equal(decoded, by_torch) and torch.equal(decoded, values)
    if n and not bool(mask.all()):
        outside = values.clone()
        outside[int(torch.nonzero(~mask)[0])] = 1.0
        with pytest.raises(ConfigError, match="outside its sibling's support"):
            stage.encode(outside, context)
    with pytest.raises(ValueError, match="stored values for a support"):
        stage.decode(torch.zeros(stored.numel() + 1, dtype=dtype), context)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 6000), st.sampled_from([torch.float32, torch.float64,
                                                                    torch.bfloat16, torch.uint8]))
def test_spread_sample_native_is_the_int64_index(n: int, count: int, dtype: torch.dtype) -> None:
    """The native spread sample takes the elements the int64 index arithmetic takes (a device's
    path), for every element size."""
    from ckptzip import hostpath
    from ckptzip.codecs.kmeans import spread_sample

    flat = (torch.arange(n, dtype=torch.float64) * 0.37 - 11).to(dtype)
    native = spread_sample(flat, count)
    with hostpath.torch_ops_only():
        assert torch.equal(spread_sample(flat, count), native)
    assert native.numel() == min(n, count)
    with pytest.raises(ValueError, match="stride"):
        N.spread_gather(np.zeros(4, np.float32), np.zeros(2, np.float32), 4, 4)


def test_bytes_equal_is_memcmp() -> None:
    a = np.arange(1000, dtype=np.uint8)
    b = a.copy()
    assert N.bytes_equal(a, b) and N.bytes_equal(a[:0], b[:0])
    b[999] ^= 1
    assert not N.bytes_equal(a, b) and not N.bytes_equal(a, a[:999])


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5000), st.integers(0, 2**31 - 1), st.sampled_from([1, 7, 1000]))
def test_kth_magnitude_is_torchs_kthvalue_and_median(n: int, seed: int, distinct: int) -> None:
    """The radix selection gives torch's k-th smallest magnitude and its median, to the bit:
    zeros of both signs, ties (few distinct values), infinities and subnormals among them."""
    from ckptzip import hostpath

    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(n, generator=generator) * torch.rand(n, generator=generator) ** 6
    values = values[torch.randint(0, min(distinct, n), (n,), generator=generator)]
    values[torch.rand(n, generator=generator) < 0.2] = -0.0
    values[torch.rand(n, generator=generator) < 0.05] = 0.0
    if n > 3:
        values[0], values[1], values[2] = float("inf"), float("-inf"), 1e-42  # a subnormal
    for k in {0, n - 1, n // 2, (n - 1) // 2, int(torch.randint(0, n, (1,), generator=generator))}:
        expected = values.abs().kthvalue(k + 1).values
        assert N.kth_magnitude(values.numpy(), k) == float(expected)
        found = hostpath.kth_magnitude(values.reshape(1, -1), k)
        assert found.dtype == torch.float32 and found.dim() == 0
        assert torch.equal(found, expected)
    assert torch.equal(hostpath.median_magnitude(values), values.abs().median())


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 2**31 - 1), st.sampled_from([1, 2, 5, 3000]))
def test_a_devices_selection_is_torchs_kthvalue_without_a_sort(n: int, seed: int,
                                                               distinct: int) -> None:
    """Off the native path (``torch_ops_only`` stands in for a device) the k-th magnitude and
    the median are a radix selection by torch's ops: the same values as torch's ``kthvalue``
    and ``median`` (ties, signed zeros, infinities, subnormals, one value), to the bit, without
    calling either (CUDA's median sorts the whole tensor, its kthvalue runs on one block); a
    NaN still goes to torch's."""
    from ckptzip import hostpath

    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(n, generator=generator) * 10.0 ** torch.randint(
        -6, 3, (n,), generator=generator).float()
    values = values[torch.randint(0, min(distinct, n), (n,), generator=generator)]
    values[torch.rand(n, generator=generator) < 0.2] = -0.0
    if n > 3:
        values[0], values[1], values[2] = float("inf"), float("-inf"), 1e-42  # a subnormal
    ranks = {0, n - 1, n // 2, int(torch.randint(0, n, (1,), generator=generator))}
    expected = {k: values.abs().kthvalue(k + 1).values for k in ranks}
    median = values.abs().median()
    called: list[str] = []

    def counted(name: str) -> object:
        original = getattr(torch.Tensor, name)

        def call(self: torch.Tensor, *args: object, **kwargs: object) -> object:
            called.append(name)
            return original(self, *args, **kwargs)
        return call

    with pytest.MonkeyPatch.context() as patch, hostpath.torch_ops_only():
        for name in ("median", "kthvalue", "sort"):
            patch.setattr(torch.Tensor, name, counted(name))
        for k in ranks:
            found = hostpath.kth_magnitude(values.reshape(1, -1), k)
            assert found.dtype == torch.float32 and found.dim() == 0
            assert torch.equal(found, expected[k]), (k, found, expected[k])
        assert torch.equal(hostpath.median_magnitude(values), median)
        assert called == []
        values[n // 2] = float("nan")
        assert bool(torch.isnan(hostpath.median_magnitude(values)))
        assert called == ["median"]


def test_kth_magnitude_leaves_a_nan_to_torch_and_refuses_a_bad_rank() -> None:
    from ckptzip import hostpath

    values = torch.tensor([3.0, float("nan"), -1.0, 2.0])
    assert N.kth_magnitude(values.numpy(), 1) is None
    def same(found: torch.Tensor, expected: torch.Tensor) -> bool:  # NaN equal to NaN
        return torch.equal(found, expected) or bool(torch.isnan(found) & torch.isnan(expected))

    for k in range(4):  # torch's answer, whatever it makes of the NaN
        assert same(hostpath.kth_magnitude(values, k), values.abs().kthvalue(k + 1).values)
    assert same(hostpath.median_magnitude(values), values.abs().median())
    for k in (-1, 4):
        with pytest.raises(ValueError, match="kth_magnitude"):
            N.kth_magnitude(values.numpy(), k)
    with pytest.raises(ValueError):
        N.kth_magnitude(np.zeros(3, dtype=np.uint8), 0)  # not a whole number of floats


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.uint8,
                                   torch.int8, torch.int32, torch.float16])
def test_count_nonzero_is_torchs(dtype: torch.dtype) -> None:
    """The native count of non-zeros is torch.count_nonzero's (-0.0 is zero, a NaN is not), on
    contiguous and strided tensors; dtypes it does not count go to torch."""
    from ckptzip import hostpath

    generator = torch.Generator().manual_seed(3)
    values = torch.randn(301, 257, generator=generator)
    values[values.abs() < 0.5] = 0.0
    values[::3, ::5] = -0.0
    values[7, 7] = float("nan")
    tensor = values.to(dtype) if dtype is not torch.bool else values != 0
    for view in (tensor, tensor.T, tensor[::2]):
        assert hostpath.count_nonzero(view) == int(torch.count_nonzero(view))
    if dtype in (torch.float32, torch.float64):
        assert N.count_nonzero(tensor.numpy(), tensor.element_size()) == int(torch.count_nonzero(tensor))
    with pytest.raises(ValueError):
        N.count_nonzero(np.zeros(4, dtype=np.uint8), 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_equal_is_torchs_all_of_equal(dtype: torch.dtype) -> None:
    """The native comparison of two tensors is torch's (a == b).all(): -0.0 equals 0.0, a NaN
    equals nothing, a difference in any element (the first, the last, in a block's tail) is
    found; strided views and dtypes it does not compare go to torch; lengths must match."""
    from ckptzip import hostpath

    generator = torch.Generator().manual_seed(4)
    for n in (0, 1, 255, 256, 257, 1000, 70001):
        a = torch.randn(n, generator=generator).to(dtype)
        a[a.abs() < 0.3] = 0.0
        b = a.clone()
        b[a == 0] = -0.0  # the same as floats, other bits
        assert hostpath.equal(a, b) and bool((a == b).all())
        for where in sorted(i for i in {0, n // 2, 255, 256, n - 1} if 0 <= i < n):
            c = b.clone()
            c[where] = float("nan")
            assert not hostpath.equal(a, c) and not hostpath.equal(c, c)
            c[where] = a[where] + 1
            assert hostpath.equal(a, c) == bool((a == c).all()) is False
    matrix = torch.randn(64, 48, generator=generator).to(dtype)
    assert hostpath.equal(matrix.T, matrix.T.clone()) and not hostpath.equal(matrix.T, matrix.T + 1)
    if dtype in (torch.float32, torch.float64):
        with pytest.raises(ValueError, match="one size"):
            N.floats_equal(matrix.numpy(), matrix[:10].numpy(), matrix.element_size())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16])
def test_has_negative_is_torchs_any_below_zero(dtype: torch.dtype) -> None:
    """The native check is torch's (x < 0).any(): -0.0 and NaN are not below zero, one negative
    anywhere (the first element, the last, a block's tail, a subnormal) is found; strided views
    and dtypes it does not scan go to torch."""
    from ckptzip import hostpath

    generator = torch.Generator().manual_seed(5)
    for n in (0, 1, 255, 256, 257, 1000, 70001):
        x = torch.rand(n, generator=generator).to(dtype)
        x[::7] = -0.0
        if n:
            x[n // 3] = float("nan")
        assert hostpath.has_negative(x) is False
        for where in sorted(i for i in {0, n // 2, 255, 256, n - 1} if 0 <= i < n):
            y = x.clone()
            y[where] = -1e-40 if dtype is not torch.float16 else -1e-7
            assert hostpath.has_negative(y) is bool((y < 0).any()) is True
    matrix = torch.rand(64, 48, generator=generator).to(dtype)
    matrix[63, 0] = -1.0
    assert hostpath.has_negative(matrix.T) and not hostpath.has_negative(matrix.T[:, :63])
    with pytest.raises(ValueError):
        N.has_negative(np.zeros(4, dtype=np.uint8), 3)


#: A child's digest of every element-wise float kernel's outputs (the lossy stages' passes) on
#: awkward inputs: lengths around the vectors' and blocks' widths, signed zeros, NaN, infinities,
#: subnormals and scales that are zero or negative.
LEVEL_CHILD = r"""
import hashlib, sys
sys.path[:0] = {paths!r}
import numpy as np
from ckptzip import _native as N
h = hashlib.sha256()
def out(*arrays):
    for a in arrays:
        h.update(repr(a).encode() if not isinstance(a, np.ndarray) else a.tobytes())
rng = np.random.default_rng(3)
special = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-40, -1e-40, 3e38, -1.0, 1.0],
                   np.float32)
for n in (0, 1, 7, 8, 9, 63, 64, 65, 255, 256, 257, 1000, 70001):
    x = (rng.standard_normal(n) * 1e-3).astype(np.float32)
    x[rng.random(n) < 0.3] = 0
    wild = x.copy()
    wild[: min(n, special.size)] = special[: min(n, special.size)]
    scale = np.abs(rng.standard_normal(n).astype(np.float32)) * 1e-6
    bad_scale = scale.copy()
    bad_scale[::3] = 0
    bad_scale[1::5] = -1.0
    bad_scale[2::7] = np.inf
    o32, o64, o8 = np.empty(n, np.float32), np.empty(n, np.float64), np.empty(n, np.int8)
    for src in (x, wild):
        for es, data in ((4, src), (8, src.astype(np.float64))):
            for dithered in (True, False):
                counts = np.zeros(255, np.uint64)
                top = N.round_levels(data, o8, counts, es, 2e-4, 77, dithered)
                out(top, o8 if top >= 0 else None, counts if top >= 0 else None)
            sums, bins = np.zeros(255), np.zeros(255, np.uint64)
            pruned = np.empty(n, data.dtype)
            top = N.uniform_bins(data, pruned, sums, bins, es, 1e-3, 0.3, 127)
            out(top, pruned if top >= 0 else None, sums if top >= 0 else None,
                bins if top >= 0 else None)
            for count in (0, 5, 31, 79, 80, 81, 200, 254):
                thresholds = np.sort(rng.standard_normal(count) * 1e-3)
                N.nearest_codes(data, thresholds, o8.view(np.uint8), es)
                out(o8)
            shifted = np.empty(n, data.dtype)
            N.dither_shift(data, shifted, es, 5, 3e-4, 1)
            N.dither_shift(shifted, shifted, es, 5, 3e-4, -1)
            out(shifted)
            out(N.step_restore(data, es, scale, o32), o32, N.step_restore(data, es, bad_scale, o32))
            N.ratio_restore(data, es, scale, o32)
            out(o32)
            out(N.sum_squares(data, None, es), N.sum_squares(data, data[::-1].copy(), es))
            flipped = data.copy()
            flipped[data == 0] = -0.0
            out(N.floats_equal(data, flipped, es), N.floats_equal(data, data[::-1].copy(), es))
        out(N.step_quotients(src, scale, o32), o32, N.step_quotients(src, bad_scale, o32))
        out(N.base_ratios(src, scale, o64), o64, N.base_ratios(src, bad_scale, o64))
        out(N.sqrt_error_squares(np.abs(src), scale), N.sqrt_error_squares(scale, np.abs(src)))
        out(N.sqrt_error_squares(bad_scale, scale))
print(h.hexdigest())
"""


def test_every_kernel_level_gives_the_float_kernels_same_bits() -> None:
    """The element-wise float kernels (the sums of squares too) are compiled for the baseline
    (SSE2) and for AVX2, and the AVX2 variant is vectorized by other rules (selects,
    whole-vector square roots and floors, four accumulators in a vector):
    capped by CKZ_CPU, each level gives every output, check and count bit for bit the same,
    specials included."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = [os.path.join(root, "src"), root]
    digests = {}
    for level in ("baseline", "v3", "all"):
        env = dict(os.environ, CKZ_CPU=level)
        run = subprocess.run([sys.executable, "-c", LEVEL_CHILD.format(paths=paths)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        digests[level] = run.stdout.strip()
    assert len(set(digests.values())) == 1, digests
