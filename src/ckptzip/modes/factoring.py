"""How the adaptive mode codes a weight update: an optional low-rank part, and unbiased rounding.

**Low rank.** Between two checkpoints the update of a weight matrix is close to low rank: on the
fidelity model a rank of 8-24 holds 80-95% of its energy (docs/LOSSY.md). :func:`factor_update`
stores it as two small factor matrices (the :class:`~ckptzip.codecs.LowRank` stage's sibling
leaves) and codes only the residual. ``V`` is the top right singular vectors, quantized; ``U`` is
the least-squares fit of the update on the *quantized* ``V``, then quantized; the residual is the
update minus their decoded product, so the factors' own error is coded with it. The rank is the one
with the fewest estimated bits for factors plus residual, if fewer than the update coded whole.

**Unbiased rounding.** The update (or its residual) is rounded to a uniform grid without bias,
the cheaper of two ways (:func:`roundings`): up or down at random with the probabilities that make
the expectation exact (stochastic rounding), or to the nearest level after a seeded subtractive
dither (:class:`~ckptzip.codecs.Dither`); the grid step is the coarsest whose *expected* error is
within the budget. Deterministic rounding with a
dead zone drops the small elements of every update, and a low-rank part drops its small
directions, the same way at every checkpoint: the progress training made there is lost each time
and the loss falls behind (docs/LOSSY.md measures 1-3% on the fidelity run). Unbiased noise is
not: training absorbs it, even at an error the size of the update.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from .. import _native, hostpath
from ..codecs import Dither, KMeans, LowRank, TransformContext
from ..codecs.dither import offsets
from ..hostpath import flat_array, native
from .quantize import entropy_bits, uniform_table

#: Both sides of a matrix are at least this for its update to be factored.
LOWRANK_MIN_SIDE = 16
#: Ranks tried, up to a quarter of the smaller side; then the two between the best and its
#: neighbours. Under an exact SVD (a small matrix) from rank 1 up until two doublings past the
#: best; under a randomized one from :data:`SEARCH_START` up until one doubling past the best,
#: then down from it while that improves.
RANKS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Where the rank search of a large matrix starts: the ranks it picks on the demo's GPT are 2 to
#: 24. Where the bits fall over the ranks and then rise, starting in the middle finds the rank a
#: search from 1 finds, in fewer trials, and one doubling past the best keeps the randomized SVD
#: at the top 32 ranks until a rank near 32 is the best (session 20: on the demo's 1152 to
#: 1536-wide weights two doublings had asked for rank 64, so for an SVD of 64 plus oversampling).
SEARCH_START = 8
#: Relative error of each quantized factor. The residual absorbs it (the product is subtracted as
#: decoded), so it only trades factor bits against residual bits: on the fidelity model's delta
#: at step 100, 0.2 made the smallest file (0.05: +7%, 0.1: +2%, 0.3: +3%).
FACTOR_BUDGET = 0.2
#: The factors' grid step, in units of their RMS, for that error: ``sqrt(12) * FACTOR_BUDGET``.
FACTOR_STEP = math.sqrt(12) * FACTOR_BUDGET
#: Header bytes a factor leaf costs (its pipeline with the codebook, its leaf entry), which the
#: rank search charges it.
FACTOR_HEADER_BYTES = 200
#: Elements the size estimates and the grid step's bisection look at (an evenly strided sample
#: beyond); the realized error is then checked on the whole tensor as decoded. 32K since session
#: 20 (128K before): the demo's delta stored the same number of bytes with either.
ESTIMATE_SAMPLES = 1 << 15
#: Elements of the evenly spaced rows the rank search forms each rank's residual on (all of a
#: small matrix): it tries about ten ranks per matrix.
TRIAL_SAMPLES = 1 << 16
#: Of those rows' elements, how many (evenly strided) each rank's bits are estimated on: the
#: expected entropy of a few dozen levels from 16K values is within 0.1% of the whole's, and the
#: ranks' estimates share the positions, so they compare like with like.
TRIAL_ESTIMATE_SAMPLES = 1 << 14
#: How close to the coarsest grid step within the budget the bisection of :func:`unbiased_step`
#: comes: a step 0.1% finer than it could be costs 0.0015 bits an element.
STEP_TOLERANCE = 1e-3
#: Most halvings of the step range the unbiased step's bisection takes.
STEP_ROUNDS = 32
#: Matrices whose smaller side is larger than this get a randomized SVD (in fp32) of the top
#: ranks, up to :data:`RANDOMIZED_TOP`: a full SVD of a 384 x 1536 update took 80 ms, and the
#: ranks the search picks on the demo's GPT are 2 to 24. The search first runs on the top
#: :data:`RANDOMIZED_FIRST` (a narrower SVD, a third of the time), and again on the top
#: ``RANDOMIZED_TOP`` only where it wanted a rank beyond them.
EXACT_SVD_SIDE = 256
RANDOMIZED_TOP = 64
RANDOMIZED_FIRST = 32
#: Power iterations of the randomized SVD (Halko et al.'s q; ``torch.svd_lowrank``'s ``niter``).
#: With 10 columns of oversampling, one finds the top directions of an update as well for the
#: rank search as two did (the demo's delta: 0.01% more bytes), at two thirds of the products.
POWER_ITERATIONS = 1
#: Most grid levels a uint8 code addresses (code 0 is zero): ``-127 .. 127``.
MAX_LEVEL = 127
#: The randomized SVD's seed (large matrices): a save does not depend on torch's random state.
SVD_SEED = 0x2545F491
#: Standard deviations of the realized squared error that a grid for a hard bound keeps below the
#: budget: unbiased rounding bounds the *expected* error, and the realized one is a sum of
#: independent terms, whose spread is large where few elements carry the error (a sparse update
#: rounded stochastically on a coarse grid). At 3 a rounding misses about once in 700 tries.
BOUND_SIGMAS = 3.0
#: Most levels :func:`level_bits` counts a sample's expected entropy over; a grid finer than that
#: over the sample is estimated from a draw.
LEVEL_BITS_LIMIT = 1 << 16
#: Stochastic rounding draws from the dither's hash of ``seed ^ STOCHASTIC_SEED_KEY``: a key of
#: its own, so that the draws are independent of the dither's (``seed``).
STOCHASTIC_SEED_KEY = 0x9E3779B9


def _sample(values: torch.Tensor, limit: int = ESTIMATE_SAMPLES) -> tuple[torch.Tensor, float]:
    """An evenly strided sample of at most ``limit`` values, and the fraction of
    the values it is."""
    flat = values.reshape(-1)
    sample = flat[:: max(1, -(-flat.numel() // limit))]
    return sample, sample.numel() / max(flat.numel(), 1)


def _host_floats(values: torch.Tensor) -> np.ndarray:
    """``values`` (a sample) as float32 on the host, flat: the searches run there, in the native
    core, whatever device the tensor is on (on a GPU their steps were thousands of small
    launches, each bisection step a synchronization)."""
    if values.is_cpu:  # in one or two torch calls, not six (each lets go of the GIL)
        return flat_array(hostpath.cast(values, torch.float32))
    return values.detach().reshape(-1).float().cpu().contiguous().numpy()


def _host_sample(values: torch.Tensor, limit: int = ESTIMATE_SAMPLES) -> tuple[np.ndarray, float]:
    """:func:`_sample` of ``values``, on the host as float32 (:func:`_host_floats`), taken once
    for all the searches of one rounding."""
    sample, fraction = _sample(values, limit)
    return _host_floats(sample), fraction


def unbiased_step(values: torch.Tensor, scale_sq: float, budget: float,
                  sigmas: float = 0.0) -> float:
    """The coarsest grid step whose unbiased rounding of ``values`` has an expected squared
    error within ``budget**2 * scale_sq``, plus ``sigmas`` standard deviations of it; 0 when no
    grid will do (a budget of 0) or none is needed (every value is 0, which any grid keeps
    exactly).

    A value at fraction ``f`` between two levels rounds up with probability ``f``: its squared
    error is ``step**2 (1 - f)**2`` then, else ``step**2 f**2``, with mean ``step**2 f (1 - f)``
    and variance ``step**4 f (1 - f) (1 - 2 f)**2``, summed over the values (bisected on a
    sample, each step's sums one native pass).
    """
    return _sample_step(*_host_sample(values), scale_sq, budget, sigmas)


def _sample_step(sample: np.ndarray, fraction: float, scale_sq: float, budget: float,
                 sigmas: float) -> float:
    """:func:`unbiased_step` from its host sample (:func:`_host_sample`), ``fraction`` of the
    values."""
    magnitudes = np.abs(sample)
    top = float(magnitudes.max()) if magnitudes.size else 0.0
    target = budget * budget * scale_sq * fraction
    if not (top > 0 and target > 0):
        return 0.0

    def error(step: float) -> float:
        mean, spread = _native.rounding_spread(magnitudes, step)
        return mean * step * step + sigmas * math.sqrt(spread * fraction) * step * step

    # a step above every value rounds each |x| to 0 or step: the mean error is step sum|x| -
    # sum x^2, the root of a quadratic in the step (without the spread's term: checked below)
    absolute = float(magnitudes.sum(dtype=np.float64))
    squares = _native.sum_squares(magnitudes, None, 4)
    beyond = (target + squares) / absolute
    if beyond >= top and (not sigmas or error(beyond) <= target):
        return beyond

    # the error is at most step^2 / 4 per value: below `fine` the budget holds for certain.
    # Bisect, on a log scale, for the coarsest step within it: error(middle) at each of at most
    # STEP_ROUNDS middles, in one native call (each round a Python step and a release of the
    # GIL before)
    fine = min(math.sqrt(target / (magnitudes.size / 4)), top)
    return _native.step_bisect(magnitudes, fraction, sigmas, target, fine, top, STEP_TOLERANCE,
                               STEP_ROUNDS)


def unbiased_levels(values: torch.Tensor, step: float, seed: int, first: int = 0) -> torch.Tensor:
    """The grid levels (int64) of ``values`` rounded to multiples of ``step``, up with
    probability equal to the fraction past the lower level, so that the expectation is the
    value. Deterministic for a seed, and the same on every device: the draws are the dither's
    counter-based hash (of a seed of their own), where a torch generator's stream depends on the
    device, so that a save from CUDA tensors made other choices than the same save on the host.
    ``first``: the index of ``values``' first element in its tensor (a piece of it)."""
    scaled = values.double() / step
    low = torch.floor(scaled)
    draws = offsets(scaled.numel(), seed ^ STOCHASTIC_SEED_KEY, values.device,
                    first).reshape(scaled.shape) + 0.5
    return (low + (draws < scaled - low)).long()


def dithered_step(values: torch.Tensor, scale_sq: float, budget: float,
                  active: int | None = None, sigmas: float = 0.0) -> float:
    """The grid step whose subtractive dither (:class:`~ckptzip.codecs.Dither`) has an expected
    squared error, plus ``sigmas`` standard deviations of it, of ``budget**2 * scale_sq``: the
    dither's error is uniform over a step, of squared mean ``step**2 / 12`` and variance
    ``step**4 / 180`` per element whatever the value (0 when the budget or the update is 0).
    ``active``: how many of the elements are coded (the others decode exactly, through an
    :class:`~ckptzip.codecs.ExactZeros` mask); all by default."""
    count = values.numel() if active is None else active
    per_step_sq = count / 12 + sigmas * math.sqrt(count / 180)
    return math.sqrt(budget * budget * scale_sq / per_step_sq) if count else 0.0


def dithered_levels(values: torch.Tensor, step: float, seed: int, first: int = 0) -> torch.Tensor:
    """The grid levels (int64) of ``values`` plus the dither of ``seed``, rounded to the nearest
    multiple of ``step``: what :class:`~ckptzip.codecs.Dither` then ``kmeans`` store.
    ``first``: as in :func:`unbiased_levels`."""
    shift = Dither(seed, step).shift(values.shape, values.device, first)
    return torch.floor((values.double() + shift) / step + 0.5).long()


@dataclass
class Rounding:
    """An update rounded without bias: its grid levels, the step, and whether a dither was added
    before rounding to the nearest level (else the rounding was stochastic). ``counts``: the
    levels' histogram, ``-MAX_LEVEL .. MAX_LEVEL``, where the native pass drew them (as int8)."""

    levels: torch.Tensor
    step: float
    dithered: bool
    counts: np.ndarray | None = None

    @property
    def bits(self) -> float:
        """The levels' order-0 entropy, in bits."""
        if self.counts is not None:
            return entropy_bits(self.counts)
        if not self.levels.numel():
            return 0.0
        counts = torch.bincount((self.levels - self.levels.min()).reshape(-1)).cpu().numpy()
        return entropy_bits(counts)

    def used_levels(self) -> np.ndarray | None:
        """The non-zero levels drawn, ascending, from the native pass's histogram; None where
        torch drew them."""
        if self.counts is None:
            return None
        used = np.flatnonzero(self.counts) - MAX_LEVEL
        return used[used != 0]

    def codes(self) -> torch.Tensor | None:
        """The uint8 codes of :func:`grid`'s table (0 for level 0, then the used levels in
        order), from the native pass's levels; None where torch drew them."""
        used = self.used_levels()
        if used is None:
            return None
        by_pattern = np.zeros(256, dtype=np.uint8)  # indexed by the int8 level's bit pattern
        by_pattern[used & 0xFF] = np.arange(1, used.size + 1)
        if native(self.levels):
            patterns = flat_array(self.levels).view(np.uint8)
            return torch.from_numpy(by_pattern[patterns]).reshape(self.levels.shape)
        table = torch.from_numpy(by_pattern).to(self.levels.device)
        codes = torch.empty(self.levels.shape, dtype=torch.uint8, device=self.levels.device)
        # in pieces: the index copies (int64) stay small
        return hostpath.in_pieces(lambda patterns: table[patterns.long()], codes,
                                  self.levels.view(torch.uint8))


def _ways(values: torch.Tensor, sample: np.ndarray, fraction: float, scale_sq: float,
          budget: float, active: int | None, sigmas: float) -> list[tuple[float, bool]]:
    """The grid step of each way of rounding ``values`` without bias within ``budget``, with
    whether it is the dithered one: stochastic first; none where no grid will do. ``sample``:
    their host sample (:func:`_host_sample`), ``fraction`` of them."""
    steps = ((_sample_step(sample, fraction, scale_sq, budget, sigmas), False),
             (dithered_step(values, scale_sq, budget, active, sigmas), True))
    return [(step, dithered) for step, dithered in steps if step > 0]


def _drawn(values: torch.Tensor, step: float, dithered: bool, seed: int) -> Rounding:
    """``values`` rounded to multiples of ``step`` the one way or the other: on the host in one
    native pass (the same levels as torch's ops, as int8 with their histogram) where every level
    fits a uint8 code's grid; else by torch's ops (a device; a level beyond ``MAX_LEVEL``,
    which :func:`grid` then refuses)."""
    if native(values) and values.is_floating_point():
        source = values.contiguous() if values.dtype in (torch.float32, torch.float64) else (
            values.float())  # bfloat16 and float16 widen exactly
        levels = hostpath.empty(source.shape, torch.int8)
        counts = np.zeros(2 * MAX_LEVEL + 1, dtype=np.uint64)
        top = _native.round_levels(flat_array(source), flat_array(levels), counts,
                                   source.element_size(), step,
                                   seed if dithered else seed ^ STOCHASTIC_SEED_KEY, dithered)
        if top >= 0:
            return Rounding(levels, step, dithered, counts)
    elif values.is_floating_point():
        drawn = _drawn_in_pieces(values, step, dithered, seed)
        if drawn is not None:
            return drawn
    levels = (dithered_levels if dithered else unbiased_levels)(values, step, seed)
    return Rounding(levels, step, dithered)


def _drawn_in_pieces(values: torch.Tensor, step: float, dithered: bool,
                     seed: int) -> Rounding | None:
    """:func:`_drawn` by torch's ops (a device), the native pass's result: int8 levels and their
    histogram, drawn ``hostpath.TORCH_PIECE`` elements at a time, so that the float64 and int64
    temporaries stay small; None where a level is beyond ``MAX_LEVEL``."""
    flat = values.reshape(-1)
    levels = torch.empty(flat.shape, dtype=torch.int8, device=flat.device)
    counts = torch.zeros(2 * MAX_LEVEL + 1, dtype=torch.int64, device=flat.device)
    draw = dithered_levels if dithered else unbiased_levels
    for start in range(0, flat.numel(), hostpath.TORCH_PIECE):
        piece = draw(flat[start:start + hostpath.TORCH_PIECE], step, seed, start)
        if piece.numel() and int(piece.abs().max()) > MAX_LEVEL:
            return None
        levels[start:start + piece.numel()] = piece
        counts += torch.bincount(piece + MAX_LEVEL, minlength=2 * MAX_LEVEL + 1)
    return Rounding(levels.reshape(values.shape), step, dithered,
                    counts.cpu().numpy().astype(np.uint64))


def roundings(values: torch.Tensor, scale_sq: float, budget: float, seed: int,
              active: int | None = None, sigmas: float = 0.0) -> list[Rounding]:
    """``values`` rounded without bias within ``budget`` (of ``sqrt(scale_sq)``), both ways:
    stochastically and with a dither. Each has the same expected error; which takes fewer bits
    depends on the update (a sparse one rounds cheaper stochastically, its small values to 0
    with an error below a dither's). Empty when no grid will do (a budget of 0). ``active``: as
    in :func:`dithered_step` (a value of 0 rounds stochastically to 0 by itself). ``sigmas``:
    grids that keep the budget by that many standard deviations of the realized error."""
    return [_drawn(values, step, dithered, seed)
            for step, dithered in _ways(values, *_host_sample(values), scale_sq, budget, active,
                                        sigmas)]


def level_bits(values: np.ndarray, step: float) -> float:
    """The expected order-0 entropy, in bits, of the levels of ``values`` (float32 on the host)
    rounded without bias to multiples of ``step``: a value at fraction ``f`` past a level lands
    one above with probability ``f``. A subtractive dither's levels have the same distribution
    (``floor(x / step + u)``, ``u`` uniform on [0, 1)), so the two ways differ in their steps
    only. It ranks ways and ranks without drawing either; a draw's entropy is within a fraction
    of a bit per level used of it. Levels beyond :data:`LEVEL_BITS_LIMIT` are drawn."""
    bits = _native.level_bits(values, step, LEVEL_BITS_LIMIT)
    if bits >= 0:
        return bits
    return _drawn(torch.from_numpy(values), step, False, 0).bits


def cheapest_roundings(values: torch.Tensor, scale_sq: float, budget: float, seed: int,
                       active: int | None = None, sigmas: float = 0.0) -> Iterator[Rounding]:
    """:func:`roundings`, the cheaper way first by its levels' expected entropy on a sample of
    ``ESTIMATE_SAMPLES`` values (all of a smaller tensor), each drawn on the whole of ``values``
    only when the caller asks for it (it takes the first whose levels fit its code)."""
    sample, fraction = _host_sample(values)
    ways = _ways(values, sample, fraction, scale_sq, budget, active, sigmas)
    if len(ways) == 2:
        ways.sort(key=lambda way: level_bits(sample, way[0]))
    for step, dithered in ways:
        yield _drawn(values, step, dithered, seed)


def unbiased_bits(values: torch.Tensor, scale_sq: float, budget: float,
                  samples: int = ESTIMATE_SAMPLES) -> float:
    """Estimated entropy-coded bits of ``values`` rounded without bias within ``budget``, the
    cheaper of the two ways (32 per value when no grid will do), from the levels' expected
    entropy (:func:`level_bits`) on a sample of at most ``samples`` values."""
    sample, fraction = _sample(values, samples)
    host = _host_floats(sample)
    ways = _ways(sample, host, 1.0, scale_sq * fraction, budget, None, 0.0)
    if not ways:
        return 32.0 * values.numel()
    return min(level_bits(host, step) for step, _ in ways) / fraction


def grid(rounding: Rounding, dtype: str) -> KMeans | None:
    """A ``kmeans`` stage whose table is the grid levels ``rounding`` uses (``k * step``, k != 0;
    codes in level order), or None when they need more than a uint8 code."""
    levels, step = rounding.levels, rounding.step
    used = rounding.used_levels()  # the native pass: every level within MAX_LEVEL
    if used is None:
        top = int(levels.abs().max()) if levels.numel() else 0
        if top > MAX_LEVEL:
            return None
        used = torch.unique(levels[levels != 0]).cpu().numpy()
    quantizer = KMeans(max(used.size, 1), dtype, precision="fp32")
    quantizer.set_table(used.astype(np.float64) * step)
    return quantizer


@dataclass
class Factor:
    """One quantized factor matrix: its quantizer, values with pruned elements zero, codes, the
    values a reader decodes (float32), and its estimated bits."""

    quantizer: KMeans
    pruned: torch.Tensor
    codes: torch.Tensor
    decoded: torch.Tensor
    bits: float


@dataclass
class Factored:
    """A weight update as ``U V^T`` plus a residual (the update minus the decoded product)."""

    rank: int
    bits: float
    u: Factor
    v: Factor
    residual: torch.Tensor


def _factor(values: torch.Tensor) -> Factor:
    """``values`` rounded to the nearest level of a uniform grid whose step, ``FACTOR_STEP``
    times their RMS, makes the relative error about :data:`FACTOR_BUDGET` (a uniform error of
    ``step**2 / 12`` per element), each level decoded at its values' mean. No search: the
    residual absorbs the factors' error, which only trades their bits against its own."""
    values = values.float().contiguous()
    rms = (float(torch.linalg.vector_norm(values, dtype=torch.float64)) / math.sqrt(values.numel())
           if values.numel() else 0.0)
    top = float(values.abs().max()) if values.numel() else 0.0
    step = max(FACTOR_STEP * rms, top / MAX_LEVEL) if rms > 0 else 1.0
    pruned, table = uniform_table(values, step, 0.5)
    quantizer = KMeans(max(table.size, 1), "float32")
    quantizer.set_table(table if table.size else np.zeros(1))
    context = TransformContext("<factor>")
    codes = quantizer.encode(pruned, context)
    return Factor(quantizer, pruned, codes, quantizer.decode(codes, context),
                  entropy_bits(_code_counts(codes)))


def _code_counts(codes: torch.Tensor) -> np.ndarray:
    """How many of the uint8 ``codes`` hold each value (256 int64 counts): numpy's bincount on
    the host (one torch call, where torch's took five: each lets go of the GIL), torch's on a
    device."""
    if codes.is_cpu:
        return np.bincount(flat_array(codes), minlength=256)
    return torch.bincount(codes.reshape(-1).long(), minlength=256).cpu().numpy()


def _columns(factor: Factor, rank: int) -> Factor:
    """The first ``rank`` columns of a quantized factor matrix, under its codebook, with the
    bits of their codes."""
    codes = factor.codes[:, :rank].contiguous()
    return Factor(factor.quantizer, factor.pruned[:, :rank].contiguous(), codes,
                  factor.decoded[:, :rank].contiguous(), entropy_bits(_code_counts(codes)))


_LINALG_READY: set[torch.device] = set()
_LINALG_LOCK = threading.Lock()


def linalg_ready(device: torch.device) -> None:
    """Load the linear-algebra library of ``device`` once, under a lock, before the planning
    threads use it. PyTorch loads its CUDA one (cuSOLVER) at the first call, and two threads that
    make their first calls at once fail with "lazy wrapper should be called at most once"
    (pytorch/pytorch#90613): an adaptive save of CUDA tensors on 16 threads did, on an H100."""
    if device.type == "cpu" or device in _LINALG_READY:
        return
    with _LINALG_LOCK:
        if device not in _LINALG_READY:
            torch.linalg.qr(torch.eye(2, device=device))
            _LINALG_READY.add(device)


def _fit_left(matrix: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """The least-squares ``U`` of ``matrix ~ U right^T`` (:func:`_solve_left`). The product
    with the matrix runs in its precision (fp32), the small solve in fp64."""
    wide = right.double()
    return _solve_left(wide.T @ wide, (matrix @ right.to(matrix.dtype)).double())


def _solve_left(gram: torch.Tensor, projected: torch.Tensor) -> torch.Tensor:
    """``U`` of the normal equations ``U gram = projected`` (``gram = R^T R``, ``projected =
    M R``), with a ridge of 1e-10 of the Gram matrix's mean diagonal, so that a quantized ``R``
    with a column pruned to zero still solves (on every device: CUDA's ``lstsq`` assumes full
    rank)."""
    ridge = 1e-10 * float(gram.diagonal().mean()) + 1e-300
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    return torch.linalg.solve(gram + ridge * eye, projected.T).T


def _randomized_right_vectors(matrix: torch.Tensor, q: int) -> torch.Tensor:
    """The top ``q`` right singular vectors (columns) by a randomized SVD (Halko et al.,
    algorithm 4.4, :data:`POWER_ITERATIONS` power iterations: ``torch.svd_lowrank``'s
    arithmetic, op for op), its
    Gaussian draws from a generator of its own on the matrix's device, seeded with
    :data:`SVD_SEED`, so that the same save gives the same bytes. ``torch.svd_lowrank`` draws
    from the device's global generator, which the planning threads share: seeded and drawn from
    by two threads at once, its draws (and a save's bytes) depended on their timing. The caller's
    random state is not touched."""
    generator = torch.Generator(device=matrix.device).manual_seed(SVD_SEED)
    tall = matrix.mH if matrix.shape[0] < matrix.shape[1] else matrix
    draws = torch.randn(tall.shape[-1], q, dtype=tall.dtype, device=tall.device,
                        generator=generator)
    basis = torch.linalg.qr(tall @ draws).Q
    for _ in range(POWER_ITERATIONS):
        basis = torch.linalg.qr(tall.mH @ basis).Q
        basis = torch.linalg.qr(tall @ basis).Q
    left, _, right_h = torch.linalg.svd(basis.mH @ tall, full_matrices=False)
    if tall is matrix:
        return right_h.mH
    return basis @ left  # the transpose's left vectors are the matrix's right ones


def _canonical_signs(vectors: torch.Tensor) -> torch.Tensor:
    """``vectors`` (columns) each with the sign that makes its largest magnitude positive. A
    singular vector's sign is arbitrary, and LAPACK and cuSOLVER pick differently; the quantized
    factor depends on it, so without this a CUDA save factored otherwise than the host's."""
    peak = vectors.gather(0, vectors.abs().argmax(dim=0, keepdim=True))
    return vectors * torch.where(peak < 0, -1.0, 1.0).to(vectors.dtype)


def factor_update(delta: torch.Tensor, scale_sq: float, budget: float) -> Factored | None:
    """The rank whose factors plus residual (rounded without bias within ``budget`` of the
    update, whose energy is ``scale_sq``) take the fewest estimated bits, if fewer than the
    update rounded whole; else None."""
    if delta.dim() < 2 or min(delta.shape[0], delta[0].numel()) < LOWRANK_MIN_SIDE:
        return None
    matrix = delta.reshape(delta.shape[0], -1).float()
    top = min(min(matrix.shape) // 4, RANKS[-1])
    if not scale_sq > 0 or top < 1:
        return None
    linalg_ready(matrix.device)
    # each rank's residual bits are estimated on evenly spaced rows (all of a small matrix),
    # without the product's other rows
    height = matrix.shape[0]
    wanted = min(height, -(-TRIAL_SAMPLES // matrix.shape[1]))
    rows = torch.linspace(0, height - 1, wanted, device=matrix.device).round().long().unique()
    sampled = matrix[rows]
    if min(matrix.shape) <= EXACT_SVD_SIDE:
        right = torch.linalg.svd(matrix.double(), full_matrices=False)[2][:top].T
        best, _ = _rank_search(matrix, right, rows, sampled, scale_sq, budget, start_rank=1,
                               doublings=2)
    else:
        top = min(top, RANDOMIZED_TOP)
        for width in (min(top, RANDOMIZED_FIRST), top):
            q = min(width + 10, min(matrix.shape))
            right = _randomized_right_vectors(matrix, q)[:, :width]
            best, truncated = _rank_search(matrix, right, rows, sampled, scale_sq, budget,
                                           start_rank=SEARCH_START, doublings=1,
                                           beyond=width < top)
            if not truncated:
                break
    fraction = rows.numel() / height
    whole = unbiased_bits(sampled, scale_sq * fraction, budget,
                          TRIAL_ESTIMATE_SAMPLES) / fraction
    if best.bits >= whole:
        return None
    context = TransformContext("<factors>", siblings={0: best.u.decoded, 1: best.v.decoded})
    best.residual = LowRank(0, 1).encode(delta, context)  # leaf numbers do not enter the arithmetic
    return best


def _rank_search(matrix: torch.Tensor, right: torch.Tensor, rows: torch.Tensor,
                 sampled: torch.Tensor, scale_sq: float, budget: float, *, start_rank: int,
                 doublings: int, beyond: bool = False) -> tuple[Factored, bool]:
    """:func:`factor_update`'s search over the ranks up to the columns of ``right`` (the top
    right singular vectors), its residuals estimated on ``matrix``'s ``rows`` (``sampled``):
    up from ``start_rank`` until ``doublings`` doublings past the best, down from the start
    while a lower rank is cheaper. The best rank's factors, and whether the search wanted a rank
    beyond those columns (only asked ``beyond``: where more can be had)."""
    top = right.shape[1]
    right = _canonical_signs(right.double())
    # the right factor of every rank is a slice of one quantization of the top vectors (their
    # columns are orthonormal, so each rank's would have had the same grid), and each rank's left
    # factor is fitted to one product of the matrix with it
    v_top = _factor(right)
    projected = (matrix @ v_top.decoded).double()
    gram = v_top.decoded.double().T @ v_top.decoded.double()
    fraction = rows.numel() / matrix.shape[0]
    tried: dict[int, Factored] = {}

    def trial(rank: int) -> Factored:
        if rank not in tried:
            v = _columns(v_top, rank)
            u = _factor(_solve_left(gram[:rank, :rank], projected[:, :rank]))
            residual = sampled - u.decoded[rows] @ v.decoded.T
            bits = (u.bits + v.bits + 2 * 8 * FACTOR_HEADER_BYTES
                    + unbiased_bits(residual, scale_sq * fraction, budget,
                                   TRIAL_ESTIMATE_SAMPLES) / fraction)
            tried[rank] = Factored(rank, bits, u, v, residual)
        return tried[rank]

    ranks = [r for r in RANKS if r <= top]
    start = max(i for i, r in enumerate(ranks) if r <= start_rank or i == 0)
    best: Factored | None = None
    stopped = False
    for rank in ranks[start:]:
        found = trial(rank)
        if best is not None and found.bits >= best.bits and rank >= 2**doublings * best.rank:
            stopped = True
            break  # past the best: the factors' cost only grows from here
        if best is None or found.bits < best.bits:
            best = found
    assert best is not None
    if best.rank == ranks[start]:
        for rank in reversed(ranks[:start]):  # down while a lower rank is cheaper
            found = trial(rank)
            if found.bits >= best.bits:
                break
            best = found
    truncated = beyond and ((not stopped and any(r > top for r in RANKS))
                            or best.rank * 3 // 2 > top)
    for rank in (best.rank * 3 // 4, best.rank * 3 // 2):
        if 1 <= rank <= top and trial(rank).bits < best.bits:
            best = tried[rank]
    return best, truncated
