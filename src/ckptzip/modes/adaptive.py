"""``mode="adaptive"``: ckptzip's own lossy policy, the smallest checkpoint within an error budget.

Per tensor and per checkpoint it searches pruning fractions and codebook sizes and keeps the
combination with the fewest estimated bits whose error is within the budget:

* weights: the residual against the base's reconstruction (closed loop), its largest elements
  kept and k-means quantized; the error is relative to the update since the base,
  ``|W^ - W| / |W - W_base|``;
* ``exp_avg``: pruned and k-means quantized on its own; error ``|m^ - m| / |m|``;
* ``exp_avg_sq``: kept where ``exp_avg`` is kept and zero elsewhere, so that both moments of a
  pruned element restart together, as ExCP's joint mask makes them (a pruned ``exp_avg`` beside
  an intact ``exp_avg_sq`` would shrink the element's next steps tenfold); quantized in the log
  domain with the fewest centroids that keep the relative error of ``sqrt(v)``, by which Adam
  divides, within budget.

Because the search reads the error and the entropy of each candidate off sorted values and
prefix sums, it costs one sort per tensor and a few k-means fits of a few dozen iterations.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..chain import Base
from ..codecs import KMeans, Support, TransformContext
from ..codecs.kmeans import lloyd_sorted, sample_sorted
from ..errors import ConfigError
from ..policy import DEFAULT_CHUNK_BYTES, Encoded
from ..tree import Leaf
from .common import GroupValues, JointPolicy, decode, finish
from .pairing import MOMENTS

STATES = ("weight", *MOMENTS)
#: The default budget: relative errors that resumed training does not notice (docs/LOSSY.md).
DEFAULT_BUDGET = {"weight": 0.27, "exp_avg": 0.75, "exp_avg_sq": 0.8}
#: Kept fractions and codebook sizes the search tries.
FRACTIONS = (1.0, 0.75, 0.5, 0.3, 0.2, 0.12, 0.07, 0.04, 0.02, 0.01, 0.005, 0.0)
CODEBOOKS = (2, 4, 8, 15, 31, 63, 255)
#: Values each candidate's k-means is fitted on (an evenly strided sample of the sorted values).
SEARCH_SAMPLES = 1 << 16
#: States whose codebook is rescaled to keep the reconstruction's projection onto the original
#: (docs/LOSSY.md: it halves the loss gap that pruned momentum causes).
DEBIASED = ("weight", "exp_avg")


#: Uniform (entropy-coded scalar) quantizer candidates: rounding offsets (0.5 rounds to the
#: nearest level; smaller ones widen the zero bin, a dead zone) and steps, as multiples of the
#: values' RMS, tried from the coarsest down.
UNIFORM_OFFSETS = (0.5, 0.35, 0.2)
UNIFORM_STEPS = tuple(float(x) for x in np.geomspace(8.0, 0.02, 48))


@dataclass(frozen=True)
class Choice:
    kept: int
    k: int
    bits: float
    error: float
    #: A uniform quantizer's step and rounding offset (``step`` 0: k-means of the kept values).
    step: float = 0.0
    offset: float = 0.5


def _entropy_bits(counts: np.ndarray) -> float:
    """Order-0 entropy of a symbol histogram, in bits for all symbols."""
    counts = counts[counts > 0].astype(np.float64)
    total = float(counts.sum())
    return float(-(counts * np.log2(counts / total)).sum()) if total else 0.0


def search(values: torch.Tensor, scale_sq: float, budget: float) -> Choice:
    """The cheapest (kept elements, codebook size) whose error ``sqrt((pruned energy + quantization
    error) / scale_sq)`` is within ``budget``; else the most accurate candidate."""
    flat = values.reshape(-1).double()
    n = flat.numel()
    magnitudes = flat.abs().sort(descending=True).values
    energy = torch.cat([flat.new_zeros(1), magnitudes.pow(2).cumsum(0)])
    total = float(energy[-1])
    ordered = flat.sort().values
    best: Choice | None = None
    for fraction in FRACTIONS:  # largest first: the pruning error only grows
        kept = round(fraction * n)
        pruned = max(total - float(energy[kept]), 0.0)
        if math.sqrt(pruned / scale_sq) > budget:
            break
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
        best = _candidates(ordered, magnitudes, kept, n, pruned, scale_sq, CODEBOOKS[-1:])[0]
    return best


def _uniform(ordered: torch.Tensor, scale_sq: float, budget: float) -> Choice | None:
    """The cheapest uniform quantizer within ``budget``: ``q = sign(x) floor(|x| / step +
    offset)``, each level reconstructed at its values' mean (``q = 0`` at zero), the levels
    entropy-coded. Its bins are ranges of the sorted values, so each candidate costs one
    ``searchsorted`` and reads its error off prefix sums. None when none fits in 255 levels."""
    n = ordered.numel()
    stride = max(1, -(-n // SEARCH_SAMPLES))
    sample = ordered[::stride].cpu().numpy()
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
        # boundaries -(j - offset) step ... (j - offset) step, j = levels..1 and 1..levels
        inner = (np.arange(1, levels + 1) - offset) * step
        edges = np.searchsorted(sample, np.concatenate([-inner[::-1], inner]))
        edges = np.concatenate([[0], edges, [sample.size]])
        counts = np.diff(edges)
        s1, s2 = sums[edges[1:]] - sums[edges[:-1]], squares[edges[1:]] - squares[edges[:-1]]
        zero = levels  # the bin between -(1 - offset) step and (1 - offset) step
        sse = s2 - s1 * s1 / np.maximum(counts, 1)
        sse[zero] = s2[zero]
        error = math.sqrt(max(float(sse.sum()), 0.0) * scale / scale_sq)
        kept = round((sample.size - int(counts[zero])) * scale)
        return Choice(kept, int((counts > 0).sum() - (counts[zero] > 0)),
                      _entropy_bits(counts) * scale, error, step, offset)

    best: Choice | None = None
    for offset in UNIFORM_OFFSETS:
        coarse = None  # the finest step that misses the budget
        for relative_step in UNIFORM_STEPS:  # coarsest first
            choice = candidate(relative_step * rms, offset)
            if choice is None:
                break
            if choice.error > budget:
                coarse = choice.step
                continue
            fine = choice.step  # fits: bisect towards the coarser neighbour, which misses
            for _ in range(10 if coarse is not None else 0):
                assert coarse is not None
                middle = math.sqrt(fine * coarse)
                trial = candidate(middle, offset)
                if trial is not None and trial.error <= budget:
                    choice, fine = trial, middle
                else:
                    coarse = middle
            best = choice if best is None or choice.bits < best.bits else best
            break
    return best


def uniform_table(values: torch.Tensor, step: float, offset: float) -> tuple[torch.Tensor, np.ndarray]:
    """``values`` with the zero bin of the uniform quantizer (``step``, ``offset``) set to zero,
    and the ascending means of its non-empty other levels (the codebook)."""
    flat = values.reshape(-1).double()
    levels = (torch.sign(flat) * torch.floor(flat.abs() / step + offset)).long()
    top = int(levels.abs().max()) if levels.numel() else 0
    bins = levels + top  # 0 .. 2 top, ascending with the value
    totals = torch.bincount(bins, weights=flat, minlength=2 * top + 1)
    counts = torch.bincount(bins, minlength=2 * top + 1)
    counts[top] = 0  # the zero bin is exactly zero, not a level
    used = counts > 0
    kept = levels != 0
    means = (totals[used] / counts[used].double()).cpu().numpy()
    return values * kept.reshape(values.shape), means


def _candidates(ordered: torch.Tensor, magnitudes: torch.Tensor, kept: int, n: int, pruned: float,
                scale_sq: float, codebooks: tuple[int, ...]) -> list[Choice]:
    """Each codebook size's bits and error when the ``kept`` largest of ``n`` values survive."""
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
    choices = []
    for k in codebooks:
        fit = lloyd_sorted(sample, k)
        bits = mask_bits + _entropy_bits(fit.counts) * scale
        choices.append(Choice(kept, k, bits, math.sqrt((pruned + fit.sse * scale) / scale_sq)))
    return choices


def _binary_entropy(p: float) -> float:
    return 0.0 if p <= 0 or p >= 1 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def prune(values: torch.Tensor, kept: int) -> torch.Tensor:
    """``values`` with all but its ``kept`` largest magnitudes set to zero."""
    flat = values.reshape(-1)
    if kept >= flat.numel():
        return values
    if kept == 0:
        return torch.zeros_like(values)
    threshold = flat.abs().kthvalue(flat.numel() - kept).values
    return values * (values.abs() > threshold)


def decoded_nonzero(encoded: Encoded) -> torch.Tensor:
    """Where a k-means-coded array decodes non-zero, as a reader sees it (a centroid may round
    to zero): its codes looked up in the codebook's non-zero flags."""
    quantizer = encoded.pipeline.transforms[-1]
    assert isinstance(quantizer, KMeans)
    codes = encoded.array
    return (quantizer.table(codes.device) != 0)[codes.long()]


class AdaptivePolicy(JointPolicy):
    mode = "adaptive"

    def __init__(self, error_budget: float | Mapping[str, float] | None = None,
                 pairing: Mapping[str, int] | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        super().__init__(pairing, chunk_bytes)
        self.budget = dict(DEFAULT_BUDGET)
        if isinstance(error_budget, Mapping):
            unknown = set(error_budget) - set(STATES)
            if unknown:
                raise ConfigError(f"adaptive: error_budget keys must be among {STATES}, not {unknown}")
            self.budget.update(error_budget)
        elif error_budget is not None:
            self.budget = dict.fromkeys(STATES, error_budget)
        if not all(isinstance(b, (int, float)) and b >= 0 for b in self.budget.values()):
            raise ConfigError(f"adaptive: error budgets must be numbers >= 0, not {error_budget!r}")

    def plan_group(self, leaves: list[Leaf], values: GroupValues, base: Base) -> dict[int, Encoded]:
        group, plans = values.group, {}
        if values.weight is not None and values.w is not None and values.w_base is not None:
            assert group.weight is not None
            delta = values.w - values.w_base
            plans[group.weight] = self._quantize(values.weight, delta, float(delta.pow(2).sum()),
                                                 "weight", residual=True, base=values.w_base)
        kept = None
        if group.exp_avg is not None and values.m is not None:
            plans[group.exp_avg] = self._quantize(leaves[group.exp_avg], values.m,
                                                  float(values.m.pow(2).sum()), "exp_avg")
            kept = decoded_nonzero(plans[group.exp_avg])
        if group.exp_avg_sq is not None and values.v is not None:
            v_leaf = leaves[group.exp_avg_sq]
            if kept is not None and kept.shape == values.v.shape:  # stored at exp_avg's support
                assert group.exp_avg is not None
                plans[group.exp_avg_sq] = self._second_moment(v_leaf, values.v, kept, group.exp_avg)
            else:
                plans[group.exp_avg_sq] = self._second_moment(v_leaf, values.v, values.v != 0)
        return plans

    def _quantize(self, leaf: Leaf, array: torch.Tensor, scale_sq: float, state: str, *,
                  residual: bool = False, base: torch.Tensor | None = None) -> Encoded:
        """Prune and quantize within the state's budget."""
        budget = self.budget[state]
        choice = search(array, max(scale_sq, 1e-300), budget)
        quantizer = KMeans(max(choice.k, 1), leaf.dtype.name)
        if choice.step > 0:
            pruned, table = uniform_table(array, choice.step, choice.offset)
            quantizer.set_table(table)
        else:
            pruned = prune(array, choice.kept)
            nonzero = pruned.reshape(-1) != 0
            quantizer.fit(pruned.reshape(-1)[nonzero])
        least_squares, codes = None, None
        if state in DEBIASED and bool((pruned != 0).any()):
            # least-squares levels shrink the reconstruction: its projection onto the original
            # falls short by the error's energy. Scaling the codebook (the codes stay) restores
            # the projection, what the state moves training by, at a larger L2 error.
            context = TransformContext(leaf.name)
            codes = quantizer.encode(pruned, context)
            rebuilt = quantizer.decode(codes, context).double()
            original = array.double()
            projection = float((rebuilt * original).sum())
            least_squares = math.sqrt(float((rebuilt - original).pow(2).sum()) / max(scale_sq, 1e-300))
            if projection > 0:
                quantizer.scale_table(float(original.pow(2).sum()) / projection)
        encoded = finish(leaf, pruned, quantizer, residual=residual, base=base, codes=codes)
        encoded.extra["error"]["budget"] = budget
        encoded.extra["error"]["quantizer"] = "uniform" if choice.step > 0 else "kmeans"
        if least_squares is not None:
            encoded.extra["error"]["rel_ls"] = float(f"{least_squares:.4g}")
        return encoded

    def _second_moment(self, leaf: Leaf, v: torch.Tensor, kept: torch.Tensor,
                       sibling: int | None = None) -> Encoded:
        """``exp_avg_sq`` where ``exp_avg`` is kept, zero elsewhere (both moments restart there,
        as ExCP's joint mask makes them), quantized in the log domain with the fewest centroids
        that keep ``sqrt(v)`` within the budget. With ``sibling`` (the leaf index of
        ``exp_avg``, whose decoded non-zeros are ``kept``), only the values there are stored: the
        mask is not paid for twice."""
        budget = self.budget["exp_avg_sq"]
        array = v * kept
        logs = sample_sorted(array[array > 0].double().log())
        k = CODEBOOKS[-1]
        for size in (1, *CODEBOOKS):  # one centroid: the mask alone, where v varies little
            # an error e in log(v) makes sqrt(v) wrong by a factor exp(e / 2): RMS of e / 2
            if math.sqrt(lloyd_sorted(logs, size).sse / max(logs.size, 1)) / 2 <= budget:
                k = size
                break
        quantizer = KMeans(k, leaf.dtype.name, "log")
        if sibling is None:
            encoded = finish(leaf, array, quantizer)
        else:
            encoded = finish(leaf, array, quantizer, support=(Support(sibling), kept))
        context = TransformContext(leaf.name, support=kept)
        decoded = decode(encoded.pipeline.transforms, encoded.array, context)
        ratio = (decoded.double()[array > 0] / array.double()[array > 0]).sqrt() - 1
        error = float(ratio.pow(2).mean().sqrt()) if ratio.numel() else 0.0
        encoded.extra["error"].update(rel_sqrt=float(f"{error:.4g}"), budget=budget)
        return encoded
