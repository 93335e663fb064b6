"""The budgeted quantizer search the lossy modes share: prune and quantize an array with the fewest
estimated bits whose error stays within a budget.

Two families of candidates, each read off the sorted values and prefix sums (one sort per array):

* k-means: the ``kept`` largest magnitudes survive (a mask, entropy-coded) and are quantized by a
  1-D k-means codebook of 2 to 255 centroids;
* uniform (entropy-coded scalar) levels ``q = sign(x) floor(|x| / step + offset)``, each level
  reconstructed at its values' mean, offsets 0.5 / 0.35 / 0.2 (dead zones), the step bisected to
  the budget.

Both are stored through the ``kmeans`` stage (a uniform quantizer's level means are its table).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from .. import _native, hostpath
from ..codecs import KMeans
from ..codecs.kmeans import (
    LLOYD_ITERATIONS,
    MAX_CENTROIDS,
    lloyd_sorted,
    nonzero_values,
    sorted_floats,
    spread_sample,
)
from ..hostpath import flat_array, native

#: Kept fractions and codebook sizes the search tries.
FRACTIONS = (1.0, 0.75, 0.5, 0.3, 0.2, 0.12, 0.07, 0.04, 0.02, 0.01, 0.005, 0.0)
CODEBOOKS = (2, 4, 8, 15, 31, 63, 255)
#: Values each candidate's k-means is fitted on (an evenly strided sample of the sorted values).
SEARCH_SAMPLES = 1 << 16
#: Above this many values the search runs on a sample of this size, spread over the tensor
#: (its two sorts of the whole tensor were a third of an adaptive save); the pruned energy and
#: the bits it reads off the sample are within a percent of the whole's, and the error of the
#: plan it picks is checked on the whole tensor as decoded.
SORT_SAMPLES = 1 << 17

#: Levels either side of zero :func:`uniform_table` bins natively (beyond, torch's ops do).
NATIVE_LEVELS = 1023
#: Uniform (entropy-coded scalar) quantizer candidates: rounding offsets (0.5 rounds to the
#: nearest level; smaller ones widen the zero bin, a dead zone) and steps, as multiples of the
#: values' RMS, tried from the coarsest down.
UNIFORM_OFFSETS = (0.5, 0.35, 0.2)
UNIFORM_STEPS = (8.0, 0.02)
#: Halvings of the log of the step range (400x) in the uniform search: to within 0.04% of a step.
UNIFORM_BISECTIONS = 14


@dataclass(frozen=True)
class Choice:
    kept: int
    k: int
    bits: float
    error: float
    #: A uniform quantizer's step and rounding offset (``step`` 0: k-means of the kept values).
    step: float = 0.0
    offset: float = 0.5


def entropy_bits(counts: np.ndarray) -> float:
    """Order-0 entropy of a symbol histogram, in bits for all symbols."""
    counts = counts[counts > 0].astype(np.float64)
    total = float(counts.sum())
    return float(-(counts * np.log2(counts / total)).sum()) if total else 0.0


def search(values: torch.Tensor, scale_sq: float, budget: float, *,
           kmeans: bool = True) -> Choice:
    """The cheapest (kept elements, codebook size) whose error ``sqrt((pruned energy + quantization
    error) / scale_sq)`` is within ``budget``; else the most accurate candidate. ``kmeans=False``
    tries only the uniform quantizers where one fits (ten times faster; the rank search's
    estimates)."""
    flat = values.reshape(-1)
    n = flat.numel()
    if n > SORT_SAMPLES:
        fraction = SORT_SAMPLES / n
        found = search(spread_sample(flat, SORT_SAMPLES), scale_sq * fraction, budget,
                       kmeans=kmeans)
        return replace(found, kept=min(n, round(found.kept / fraction)),
                       bits=found.bits / fraction)
    # on the host whatever the device (at most SORT_SAMPLES values, 1 MiB): on a GPU the
    # search's steps were hundreds of small launches, a synchronization each, and a device's
    # running sums could pick another candidate than the host's
    ordered = ascending(flat if flat.is_cpu else flat.cpu())
    chosen = _native_search(ordered, scale_sq, budget, kmeans)
    return chosen if chosen is not None else _search_sorted(ordered, scale_sq, budget, kmeans)


#: The search's constants as the native core takes them.
_FRACTIONS = np.array(FRACTIONS, dtype=np.float64)
_CODEBOOKS = np.array(CODEBOOKS, dtype=np.int64)
_OFFSETS = np.array(UNIFORM_OFFSETS, dtype=np.float64)


def _native_search(ordered: torch.Tensor, scale_sq: float, budget: float,
                   kmeans: bool) -> Choice | None:
    """:func:`_search_sorted` in one call to the native core, over ascending host values: the
    same choice, bit for bit (``tests/test_quantize_native.py``), with the GIL let go once where
    the Python search took it back some 200 times (its candidates, fits and bisections). None
    where the core does not take the values (one not finite, a budget not >= 0)."""
    found = _native.quantize_search(
        flat_array(hostpath.cast(ordered, torch.float64)), scale_sq, budget, kmeans, _FRACTIONS,
        _CODEBOOKS, _OFFSETS, UNIFORM_STEPS[0], UNIFORM_STEPS[-1], UNIFORM_BISECTIONS,
        SEARCH_SAMPLES, LLOYD_ITERATIONS)
    if found is None:
        return None
    kept, k, bits, error, step, offset = found
    return Choice(kept, k, bits, error, step, offset)


def _search_sorted(ordered: torch.Tensor, scale_sq: float, budget: float, kmeans: bool) -> Choice:
    """:func:`search` over the ascending (float64) values, by torch's and numpy's ops: where the
    native search declines, and the reference it is tested against."""
    n = ordered.numel()
    if not kmeans:
        uniform = _uniform(ordered, scale_sq, budget)
        if uniform is not None:
            return uniform
    magnitudes = descending_magnitudes(ordered)
    energy = torch.cat([ordered.new_zeros(1), magnitudes.pow(2).cumsum(0)])
    total = float(energy[-1])
    best: Choice | None = None
    for fraction in FRACTIONS:  # largest first: the pruning error only grows
        kept = round(fraction * n)
        pruned = max(total - float(energy[kept]), 0.0)
        if math.sqrt(pruned / scale_sq) > budget:
            break
        candidates: Iterable[Choice]
        if kept == 0:
            candidates = [Choice(0, 1, 0.0, math.sqrt(total / scale_sq))]
        else:
            candidates = _candidates(ordered, magnitudes, kept, n, pruned, scale_sq, CODEBOOKS)
        for choice in candidates:
            if choice.error <= budget:  # the first that fits: larger codebooks cost more
                best = choice if best is None or choice.bits < best.bits else best
                break
    uniform = _uniform(ordered, scale_sq, budget)
    if uniform is not None and (best is None or uniform.bits < best.bits):
        best = uniform
    if best is None:  # nothing fits: the most accurate candidate
        kept = round(FRACTIONS[0] * n)
        pruned = max(total - float(energy[kept]), 0.0)
        best = next(_candidates(ordered, magnitudes, kept, n, pruned, scale_sq, CODEBOOKS[-1:]))
    return best


def ascending(values: torch.Tensor) -> torch.Tensor:
    """``values`` (1-D) sorted, as float64: on the host by the native radix sort
    (:func:`~ckptzip.codecs.kmeans.sorted_floats`), in their own precision where it has it
    (float32 sorts twice as fast as float64; widening after the sort gives the same values)."""
    if not native(values):
        return values.double().sort().values
    if values.dtype not in (torch.float32, torch.float64):
        values = values.float()
    return torch.from_numpy(sorted_floats(values.contiguous().numpy())).double()


def descending_magnitudes(ordered: torch.Tensor) -> torch.Tensor:
    """The magnitudes of the ascending ``ordered``, largest first: its negatives reversed and its
    non-negatives are two ascending runs, which the native core merges in one pass (numpy's
    stable sort, timsort, where a value is NaN)."""
    if not native(ordered):
        return ordered.abs().sort(descending=True).values
    values = np.ascontiguousarray(ordered.numpy(), dtype=np.float64)
    merged = np.empty_like(values)
    if _native.descending_magnitudes(values, merged):  # one native merge
        return torch.from_numpy(merged)
    split = int(np.searchsorted(values, 0.0))
    runs = np.concatenate([-values[:split][::-1], np.abs(values[split:])])
    return torch.from_numpy(np.sort(runs, kind="stable")[::-1].copy())


def _uniform(ordered: torch.Tensor, scale_sq: float, budget: float) -> Choice | None:
    """The cheapest uniform quantizer within ``budget``: ``q = sign(x) floor(|x| / step +
    offset)``, each level reconstructed at its values' mean (``q = 0`` at zero), the levels
    entropy-coded. Its bins are ranges of the sorted values, so each candidate costs a binary
    search per bin edge and reads its error off prefix sums. None when none fits in 255
    levels."""
    n = ordered.numel()
    stride = max(1, -(-n // SEARCH_SAMPLES))
    sample = np.ascontiguousarray(ordered[::stride].cpu().numpy())
    scale = n / max(sample.size, 1)
    sums = np.concatenate([[0.0], np.cumsum(sample)])
    squares = np.concatenate([[0.0], np.cumsum(sample * sample)])
    rms = math.sqrt(squares[-1] / max(sample.size, 1))
    top = float(np.abs(sample).max()) if sample.size else 0.0
    if not rms > 0:
        return None
    def candidate(step: float, offset: float) -> Choice | None:
        levels = math.floor(top / step + offset)
        if 2 * levels > 255:
            return None
        # the bins between -(j - offset) step and (j - offset) step, j = levels..1 and 1..levels:
        # one native pass of binary searches and sums (numpy's arithmetic)
        zero, used, bits, sse = _native.uniform_candidate(sample, sums, squares, step, offset,
                                                          levels)
        error = math.sqrt(max(sse, 0.0) * scale / scale_sq)
        return Choice(round((sample.size - zero) * scale), used, bits * scale, error, step,
                      offset)

    best: Choice | None = None
    coarsest, finest = UNIFORM_STEPS[0] * rms, UNIFORM_STEPS[-1] * rms
    for offset in UNIFORM_OFFSETS:
        # the error grows with the step, and below some step the levels overflow a uint8 code
        # (no candidate): bisect, on a log scale, for the coarsest step that still fits
        choice = candidate(coarsest, offset)
        if choice is None or choice.error > budget:
            fits, coarse, fine = None, coarsest, finest
            found = candidate(fine, offset)
            if found is not None and found.error <= budget:
                fits = found
            for _ in range(UNIFORM_BISECTIONS):
                middle = math.sqrt(fine * coarse)
                trial = candidate(middle, offset)
                if trial is not None and trial.error > budget:
                    coarse = middle
                else:
                    fine, fits = middle, trial if trial is not None else fits
            choice = fits
        if choice is not None and (best is None or choice.bits < best.bits):
            best = choice
    return best


def uniform_table(values: torch.Tensor, step: float, offset: float) -> tuple[torch.Tensor, np.ndarray]:
    """``values`` with the zero bin of the uniform quantizer (``step``, ``offset``) set to zero,
    and the ascending means of its non-empty other levels (the codebook). On the host the native
    core does it in one pass, for levels up to ``NATIVE_LEVELS`` either side."""
    if native(values) and values.dtype in (torch.float32, torch.float64):
        source = values.contiguous()
        pruned = hostpath.empty(source.shape, source.dtype)
        level_sums = np.zeros(2 * NATIVE_LEVELS + 1)
        level_counts = np.zeros(2 * NATIVE_LEVELS + 1, dtype=np.uint64)
        top = _native.uniform_bins(flat_array(source), flat_array(pruned),
                                   level_sums, level_counts, source.element_size(), step, offset,
                                   NATIVE_LEVELS)
        if top >= 0:
            filled = level_counts > 0
            return (pruned.reshape(values.shape),
                    level_sums[filled] / level_counts[filled].astype(np.float64))
    # torch's ops (a device; levels beyond NATIVE_LEVELS), hostpath.TORCH_PIECE elements at a
    # time, so that no float64 or int64 copy of the whole is held (on a GPU they had been six
    # times a weight's bytes at once): first the largest magnitude, whose level is the largest
    # (for an offset in [0, 1) a level grows with |x|, as _uniform's candidates take it), in the
    # same float64 arithmetic as each element's below
    source = values.contiguous()
    flat = source.reshape(-1)
    pieces = range(0, flat.numel(), hostpath.TORCH_PIECE)
    largest = max((float(flat[start:start + hostpath.TORCH_PIECE].abs().max()) for start in pieces),
                  default=0.0)
    top = math.floor(largest / step + offset)
    totals = torch.zeros(2 * top + 1, dtype=torch.float64, device=flat.device)
    counts = torch.zeros(2 * top + 1, dtype=torch.int64, device=flat.device)
    pruned = torch.empty_like(source)
    out = pruned.view(-1)
    for start in pieces:
        piece = flat[start:start + hostpath.TORCH_PIECE]
        wide = piece.double()
        levels = (torch.sign(wide) * torch.floor(wide.abs() / step + offset)).long()
        bins = levels + top  # 0 .. 2 top, ascending with the value
        totals += torch.bincount(bins, weights=wide, minlength=2 * top + 1)
        counts += torch.bincount(bins, minlength=2 * top + 1)
        out[start:start + piece.numel()] = piece * (levels != 0)
    counts[top] = 0  # the zero bin is exactly zero, not a level
    used = counts > 0
    means = (totals[used] / counts[used].double()).cpu().numpy()
    return pruned.reshape(values.shape), means


def _candidates(ordered: torch.Tensor, magnitudes: torch.Tensor, kept: int, n: int, pruned: float,
                scale_sq: float, codebooks: tuple[int, ...]) -> Iterator[Choice]:
    """Each codebook size's bits and error when the ``kept`` largest of ``n`` values survive,
    fitted as they are asked for (the search stops at the first that fits)."""
    threshold = magnitudes[kept - 1:kept].to(ordered.dtype)
    # the survivors are the two tails of the sorted values
    negative = int(torch.searchsorted(ordered, -threshold, right=True))
    positive = int(torch.searchsorted(ordered, threshold))
    count = negative + ordered.numel() - positive
    step = max(1, -(-count // SEARCH_SAMPLES))
    survivors = torch.cat([ordered[:negative:step], ordered[positive::step]])
    sample = survivors.cpu().numpy()
    scale = count / sample.size
    mask_bits = n * _binary_entropy(kept / n)
    for k in codebooks:
        fit = lloyd_sorted(sample, k)
        bits = mask_bits + entropy_bits(fit.counts) * scale
        yield Choice(kept, k, bits, math.sqrt((pruned + fit.sse * scale) / scale_sq))


def _binary_entropy(p: float) -> float:
    return 0.0 if p <= 0 or p >= 1 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def prune(values: torch.Tensor, kept: int) -> torch.Tensor:
    """``values`` with all but its ``kept`` largest magnitudes set to zero."""
    flat = values.reshape(-1)
    if kept >= flat.numel():
        return values
    if kept == 0:
        return torch.zeros_like(values)
    threshold = hostpath.kth_magnitude(flat, flat.numel() - kept - 1)
    return values * (values.abs() > threshold)


def fitted(array: torch.Tensor, scale_sq: float, budget: float, dtype: str, *,
            kmeans: bool = True) -> tuple[Choice, KMeans, torch.Tensor]:
    """The cheapest quantizer within ``budget`` (error relative to ``sqrt(scale_sq)``), fitted,
    and ``array`` with its pruned elements zero (``kmeans``: as in :func:`search`)."""
    choice = search(array, max(scale_sq, 1e-300), budget, kmeans=kmeans)
    if choice.step > 0:
        # the search saw a sample: the whole array may use a few more levels (its extremes)
        pruned, table = uniform_table(array, choice.step, choice.offset)
        if table.size <= MAX_CENTROIDS:
            quantizer = KMeans(max(table.size, 1), dtype)
            quantizer.set_table(table)
            return choice, quantizer, pruned
        choice = Choice(array.numel(), MAX_CENTROIDS, choice.bits, choice.error)  # k-means, all kept
    quantizer = KMeans(max(choice.k, 1), dtype)
    pruned = prune(array, choice.kept)
    quantizer.fit(nonzero_values(pruned.reshape(-1)))
    return choice, quantizer, pruned
