"""``mode="adaptive"``: ckptzip's own lossy policy, the smallest checkpoint within an error budget.

Per tensor and per checkpoint:

* weights: the update against the base's reconstruction (closed loop) is rounded *without bias*
  (stochastically, or with a subtractive dither where that is cheaper; marked) to the coarsest
  uniform grid whose expected error is within the budget, relative to the update training made
  since the base (:mod:`.carried` tells whether the update also carries the base's error), after
  subtracting a quantized low-rank product where the rank search finds that cheaper
  (:mod:`.factoring`; the factors are leaves of their own, read by the ``lowrank`` stage);
* ``exp_avg``: pruned and quantized on its own (the cheapest of k-means and uniform candidates
  within the budget, :mod:`.quantize`), its codebook rescaled to keep its projection; error
  ``|m^ - m| / |m|``;
* ``exp_avg_sq``: kept where ``exp_avg`` is kept and zero elsewhere, so that both moments of a
  pruned element restart together, as ExCP's joint mask makes them (a pruned ``exp_avg`` beside
  an intact ``exp_avg_sq`` would shrink the element's next steps tenfold); stored only at that
  support, quantized in the log domain with the fewest centroids that keep the relative error of
  ``sqrt(v)``, by which Adam divides, within budget.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping

import numpy as np
import torch

from ..chain import Base
from ..codecs import Dither, KMeans, LowRank, Mark, Support, TensorToTensor, TransformContext
from ..codecs.kmeans import Fit, lloyd_sorted, sample_sorted
from ..dtypes import from_name
from ..errors import ConfigError
from ..policy import DEFAULT_CHUNK_BYTES, Encoded
from ..tree import Leaf
from .carried import MARK, base_error_energy, base_mark, carried_fraction
from .common import GroupValues, JointPolicy, decode, finish
from .factoring import Rounding, factor_update, grid, roundings
from .pairing import MOMENTS
from .quantize import CODEBOOKS, fitted

STATES = ("weight", *MOMENTS)
#: The default budget: relative errors that resumed training does not notice (docs/LOSSY.md). The
#: weights' is the expected error of unbiased rounding, which training absorbs even at the size
#: of the update; the moments' are errors of deterministic pruning and quantization.
DEFAULT_BUDGET = {"weight": 1.5, "exp_avg": 0.8, "exp_avg_sq": 0.8}
#: The weight budget must stay below this. The budget is relative to the update training made
#: since the base, estimated as ``|r|^2 - |e|^2`` when the update against the decoded base ``r``
#: carries the base's error ``e`` (:mod:`.carried`), but never below :data:`UPDATE_FLOOR` of
#: ``|r|^2``: a tensor that training left alone is then re-rounded at ``b^2 * UPDATE_FLOOR`` of
#: the base's error energy, which must stay below 1 for its error to die out along a chain.
MAX_WEIGHT_BUDGET = 2.0
UPDATE_FLOOR = 0.2
#: The weight budget against a base in memory, whose own error (if it is a reconstruction) no
#: record tells: below 1, a chain's error stays bounded whatever the base carried, at
#: ``b / sqrt(1 - b^2)`` of an update (1.33 at 0.8).
UNRECORDED_BASE_BUDGET = 0.8
#: States whose codebook is rescaled to keep the reconstruction's projection onto the original
#: (docs/LOSSY.md: it halves the loss gap that pruned momentum causes). Weights are rounded
#: without bias instead (:mod:`.factoring`), unless their budget is too tight for a grid.
DEBIASED = ("weight", "exp_avg")


def decoded_nonzero(encoded: Encoded) -> torch.Tensor:
    """Where a k-means-coded array decodes non-zero, as a reader sees it (a centroid may round
    to zero): its codes looked up in the codebook's non-zero flags."""
    quantizer = encoded.pipeline.transforms[-1]
    assert isinstance(quantizer, KMeans)
    codes = encoded.array
    return (quantizer.table(codes.device) != 0)[codes.long()]


def sqrt_error(logs: np.ndarray, fit: Fit) -> float:
    """The RMS relative error of ``sqrt(v)`` when the ascending ``logs`` of ``v`` are replaced
    by their clusters' centroids: an error ``e`` in ``log(v)`` makes ``sqrt(v)`` wrong by a
    factor ``exp(e / 2)``, which for the small values of a wide spread is far above ``e / 2``."""
    if not logs.size:
        return 0.0
    assigned = np.repeat(fit.centroids, fit.counts)
    return float(np.sqrt(np.mean(np.expm1((assigned - logs) / 2) ** 2)))


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
        if self.budget["weight"] >= MAX_WEIGHT_BUDGET:
            raise ConfigError(
                f"adaptive: a weight budget of {self.budget['weight']} (>= {MAX_WEIGHT_BUDGET}) "
                f"lets a chain's error grow at every checkpoint where training left a tensor "
                f"alone; give less (default {DEFAULT_BUDGET['weight']})")
        #: How much of their base's error this checkpoint's weight updates carry (:meth:`survey`).
        self.carried = 1.0

    def survey(self, leaves: list[Leaf], groups: list[GroupValues], base: Base) -> None:
        """Whether training went on from the true state (the updates carry the base's error) or
        resumed from the base's reconstruction: one answer for the whole checkpoint."""
        def updates() -> Iterator[tuple[torch.Tensor, Mark]]:
            # one at a time: not every weight's update held at once
            for values in groups:
                if values.weight is None or values.w is None or values.w_base is None:
                    continue
                mark = base_mark(base, values.weight.name)
                if mark is not None:
                    yield values.w - values.w_base, mark

        self.carried = carried_fraction(updates())

    def plan_group(self, leaves: list[Leaf], values: GroupValues, base: Base) -> dict[int, Encoded]:
        group, plans = values.group, {}
        if values.weight is not None and values.w is not None and values.w_base is not None:
            assert group.weight is not None
            plans.update(self._weight(group.weight, values.weight, values.w, values.w_base,
                                      base))
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

    def _weight(self, index: int, leaf: Leaf, w: torch.Tensor, w_base: torch.Tensor,
                base: Base) -> dict[int, Encoded]:
        """The weight's update, rounded without bias within its budget (:mod:`.factoring`),
        after the product of two added factor leaves where that is cheaper
        (:class:`~ckptzip.codecs.LowRank`); pruned and quantized like a moment where the budget
        is too tight for a grid a uint8 code addresses."""
        budget = self.budget["weight"]
        if base.stored(leaf.name) is None:
            budget = min(budget, UNRECORDED_BASE_BUDGET)
        delta = w - w_base
        scale_sq = energy = float(delta.double().pow(2).sum())
        inherited = self.carried * base_error_energy(base, leaf.name)
        if inherited > 0:  # the budget is relative to the update, not to the base's error
            scale_sq = max(energy - inherited, UPDATE_FLOOR * energy)
        factored = factor_update(delta, scale_sq, budget, MARK)
        rounded = self._rounded(leaf, delta if factored is None else factored.residual, scale_sq,
                               budget)
        if rounded is None and factored is not None:
            factored, rounded = None, self._rounded(leaf, delta, scale_sq, budget)
        if rounded is None:
            return {index: self._quantize(leaf, delta, scale_sq, "weight", residual=True,
                                          base=w_base, budget=budget)}
        values, quantizer, rounding, stages = rounded
        plans: dict[int, Encoded] = {}
        lowrank = None
        if factored is not None:
            stage = LowRank(self.add_leaf(), self.add_leaf())
            lowrank = (stage, {stage.u: factored.u.decoded, stage.v: factored.v.decoded})
            for j, which, factor in ((stage.u, "u", factored.u), (stage.v, "v", factored.v)):
                added = Leaf(f"{leaf.name}:lowrank.{which}", (*leaf.path, f":lowrank.{which}"),
                             from_name("float32"), tuple(factor.decoded.shape), factor.decoded)
                plans[j] = finish(added, factor.pruned, factor.quantizer, codes=factor.codes)
                plans[j].added = added
                del plans[j].extra["error"]  # the weight's record covers its factors
        plans[index] = finish(leaf, values, quantizer, residual=True, base=w_base,
                              lowrank=lowrank, rounding=stages)
        plans[index].extra["error"].update(
            budget=budget, quantizer="dithered" if rounding.dithered else "stochastic",
            step=float(f"{rounding.step:.4g}"),
            rank=0 if factored is None else factored.rank)
        if inherited > 0:
            plans[index].extra["error"]["carried"] = float(f"{inherited / max(energy, 1e-300):.3g}")
        return plans

    def _rounded(self, leaf: Leaf, array: torch.Tensor, scale_sq: float, budget: float,
                 ) -> tuple[torch.Tensor, KMeans, Rounding, tuple[TensorToTensor, ...]] | None:
        """``array`` rounded without bias within ``budget`` (of ``sqrt(scale_sq)``), the
        cheaper of stochastically and with a dither (:func:`.factoring.roundings`), and marked
        (:mod:`.carried`): the values the ``kmeans`` stage stores (dither included), that stage,
        the rounding, and the mark and dither stages; None when no grid fits a uint8 code. The
        draws are seeded by the tensor's name and update, so a save is reproducible and
        consecutive checkpoints draw afresh. The update's energy enters with 7 significant
        digits: its last bits depend on the order of the sum, which differs between devices."""
        seed = zlib.crc32(f"{leaf.name}:{scale_sq:.6e}".encode())
        best = None
        for rounding in roundings(array, scale_sq, budget, seed, MARK):
            quantizer = grid(rounding.levels, rounding.step, leaf.dtype.name)
            if quantizer is not None and (best is None or rounding.bits < best[2].bits):
                stages: tuple[TensorToTensor, ...] = (Mark(seed, rounding.step, MARK),)
                if rounding.dithered:
                    stages = (*stages, Dither(seed, rounding.step))
                best = ((rounding.levels.double() * rounding.step).to(array.dtype), quantizer,
                        rounding, stages)
        return best

    def _quantize(self, leaf: Leaf, array: torch.Tensor, scale_sq: float, state: str, *,
                  residual: bool = False, base: torch.Tensor | None = None,
                  budget: float | None = None) -> Encoded:
        """Prune and quantize within ``budget``, by default the state's."""
        budget = self.budget[state] if budget is None else budget
        choice, quantizer, pruned = fitted(array, scale_sq, budget, leaf.dtype.name)
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
            if sqrt_error(logs, lloyd_sorted(logs, size)) <= budget:
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
