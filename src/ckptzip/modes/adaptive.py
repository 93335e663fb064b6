"""``mode="adaptive"``: ckptzip's own lossy policy, the smallest checkpoint within an error budget.

Per tensor and per checkpoint, against the base as decoded (closed loop):

* a tensor equal to the base's decoded tensor is stored as unchanged, bit-exact
  (:class:`~ckptzip.modes.common.JointPolicy`);
* weights: the update is rounded *without bias* (stochastically, or with a subtractive dither
  where that is cheaper) to the coarsest uniform grid whose expected error is within the budget,
  relative to the update training made since the base, after subtracting a quantized low-rank
  product where the rank search finds that cheaper (:mod:`.factoring`; the factors are leaves
  of their own, read by the ``lowrank`` stage). Elements whose update is exactly zero decode
  exactly (an added mask of the changed elements, read by the ``zeros`` stage). Whether the
  update also carries the base's own error is stated by the caller (``resumed``), not guessed;
* ``exp_avg``: pruned and quantized (the cheapest of k-means and uniform candidates within the
  budget, :mod:`.quantize`), its codebook rescaled to keep its projection. With ``step_coding``
  (the default), wherever ``exp_avg_sq`` is coded beside it at every element, as Adam's step
  ``u = m / sqrt(v^)`` (``v^`` the ``exp_avg_sq`` as decoded, read back by the ``sqrt-scale``
  stage), error ``|u^ - u| / |u|``, by default 0.665; as itself elsewhere, error
  ``|m^ - m| / |m|``, 0.665 where both moments restart (below), 0.3325 with
  ``step_coding=False``. SGD's ``momentum_buffer`` is coded as itself, with ``exp_avg``'s
  budget for a moment (0.3325): SGD steps by ``lr * buffer`` as Adam steps by
  ``lr * exp_avg / sqrt(exp_avg_sq)``;
* ``exp_avg_sq``: quantized in the log domain with the fewest centroids that keep the relative
  error of ``sqrt(v)``, by which Adam divides, within budget. Where ``exp_avg`` is pruned it is
  kept (a second moment restarted from zero lets its element take steps many times its steady
  ones under ``beta2 = 0.999``), except where the state's optimizer says ``beta2 <= 0.99`` or
  ``joint_restart=True`` asks: there both moments of a pruned element restart together, as
  ExCP's joint mask makes them, and ``exp_avg_sq`` is stored only at ``exp_avg``'s support.
  With ``ratio_coding`` (the default), where it is kept, it is coded as its ratio to the
  base's decoded ``exp_avg_sq`` (the ``base-ratio`` stage) whenever that needs no more
  centroids: between checkpoints it moves mostly by a common factor, so one or two centroids
  hold the budget. A base that is zero where the moment is not (an embedding's token first seen
  since) is taken as the median of its positive elements there (``base-ratio-filled``), and
  where the base's zeros are a pattern worth it, the codes are stored with them first
  (``base-partition``).

Every budget bounds the error a reader decodes, checked by the encoder on the decoded tensor; a
tensor whose bound no candidate keeps is stored bit-exact.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import zlib
from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch

from .. import _native, hostpath
from ..chain import Base
from ..codecs import (
    BasePartition,
    BaseRatio,
    Dither,
    ExactZeros,
    FilledBaseRatio,
    KMeans,
    LowRank,
    Support,
    TensorToTensor,
    TransformContext,
    undo,
)
from ..codecs.base_ratio import base_ratios, zero_fill
from ..codecs.kmeans import Fit, lloyd_sorted, nonzero_values, sample_sorted
from ..codecs.sqrt_scale import SqrtScale, step_quotients
from ..codecs.zeros import pack_changed
from ..dtypes import from_name
from ..errors import ConfigError
from ..hostpath import flat_array, native
from ..policy import DEFAULT_CHUNK_BYTES, Encoded, Exact
from ..tree import Leaf
from .common import (
    GroupValues,
    JointPolicy,
    coded,
    distance,
    error_record,
    finish,
    finish_decoded,
    finished,
    honoured,
    magnitude,
)
from .factoring import BOUND_SIGMAS, Rounding, cheapest_roundings, factor_update, grid
from .pairing import MOMENTS, MOMENTUM_ROLES, moment_key
from .quantize import CODEBOOKS, fitted

STATES = ("weight", *MOMENTS)
#: The default budget: relative errors that resumed training does not notice (docs/LOSSY.md),
#: each a bound on the error a reader decodes. The weights' is relative to the update training
#: made since the base (unbiased rounding). ``exp_avg``'s is relative to the moment, after its
#: codebook is rescaled to keep the projection: its least-squares fit is then held to
#: 0.3325 / sqrt(1 + 0.3325^2) = 0.32. That of ``exp_avg_sq`` bounds the RMS relative error of
#: ``sqrt(v)`` where it is kept. The fidelity matrix (docs/BENCHMARKS.md §5) measured each: at
#: ``exp_avg`` 0.665 (session 15's default) the MiniLM fine-tune ended +0.73% [+0.54, +0.91]
#: behind against a 0.86% noise floor, 3% of its momentum kept. With the ratio coding, halving
#: the weights' budget did not help there (+1.28%, one seed); halving ``exp_avg``'s did (+0.45%
#: [+0.32, +0.64]), and it is within noise in the other setups too. Earlier defaults, about
#: twice these (1.5, 1.33, 0.8), diverged. Where ``exp_avg`` is coded as Adam's step (the
#: default where its ``exp_avg_sq`` is kept) its budget is :data:`STEP_EXP_AVG_BUDGET` instead.
DEFAULT_BUDGET = {"weight": 0.75, "exp_avg": 0.3325, "exp_avg_sq": 0.4}
#: ``exp_avg``'s default where both moments of a pruned element restart (by default where the
#: optimizer's ``beta2`` is at most :data:`JOINT_RESTART_BETA2`): session 15's 0.665. There the
#: pruned elements' second moments restart too and recover within a few dozen steps; on the 0.44M
#: GPT under betas 0.9/0.95 it was within noise (-0.02% [-0.12, +0.16], floor 0.23%) and the
#: halved budget was not (-0.10% [-0.33, +0.09]), at 2/3 of the ratio.
RESTART_EXP_AVG_BUDGET = 0.665
#: ``exp_avg``'s default where it is coded as Adam's step ``m / sqrt(v^)`` (``step_coding``),
#: relative to the step's norm. Measured in the fidelity matrix (docs/BENCHMARKS.md §5, 3 seeds):
#: within noise where the step coding applies, at 12-37% fewer bytes and a smaller gap than the
#: moment coded as itself at 0.3325 (the 10.75M GPT 63.5x at -0.21%, MiniLM 51.7x at +0.30%
#: against a 0.86% floor, LoRA 1186x at +0.10%); at 0.9975 the MiniLM fine-tune was outside
#: (+1.12%, 77.5x).
STEP_EXP_AVG_BUDGET = 0.665
#: What the base's zero pattern costs a second moment's codes in C order, at most (its order-0
#: entropy, ``n H(zeros / n)`` bits), from which on they are stored with those zeros first (the
#: ``base-partition`` stage). Below, the stage's entry in the header can cost more than it saves:
#: a LoRA fine-tune's classifier head (66 x 384, a row or two of zeros) stored 0.05% more bytes
#: with it; MiniLM's word embedding (3.0M elements, 72% zero rows) 11% fewer.
PARTITION_MIN_BYTES = 512
#: The weight budget must stay below this. The budget is relative to the update training made
#: since the base, estimated as ``|r|^2 - |e|^2`` when the update against the decoded base ``r``
#: carries the base's error ``e`` (training went on from the true state), but never below
#: :data:`UPDATE_FLOOR` of ``|r|^2``: a tensor that training left alone is then re-rounded at
#: ``b^2 * UPDATE_FLOOR`` of the base's error energy, which must stay below 1 for its error to
#: die out along a chain.
MAX_WEIGHT_BUDGET = 2.0
UPDATE_FLOOR = 0.2
#: The weight budget against a base in memory, whose own error (if it is a reconstruction) no
#: record tells: below 1, a chain's error stays bounded whatever the base carried, at
#: ``b / sqrt(1 - b^2)`` of an update (1.33 at 0.8).
UNRECORDED_BASE_BUDGET = 0.8
#: ``joint_restart=None`` restarts both moments of a pruned element where the optimizer's
#: ``beta2`` is at most this (measured: 0.95 gains from it, 0.999 diverges; docs/LOSSY.md).
JOINT_RESTART_BETA2 = 0.99
#: Fractions of the budget that successive tries aim the expected error at, when a rounding's
#: or a fit's decoded error missed the bound (both see a sample or an expectation, not the
#: whole); after the last, the tensor is stored another way, or bit-exact.
RETRY_BUDGETS = (1.0, 0.9, 0.75, 0.5)
#: States whose codebook is rescaled to keep the reconstruction's projection onto the original
#: (docs/LOSSY.md: it halves the loss gap that pruned momentum causes). Weights are rounded
#: without bias instead (:mod:`.factoring`), unless their budget is too tight for a grid.
DEBIASED = ("weight", "exp_avg")


#: An update rounded for the ``kmeans`` stage: the values it stores or (from the native pass)
#: their codes, that stage, the rounding and the stages before it (a dither).
RoundedUpdate = tuple[torch.Tensor | None, torch.Tensor | None, KMeans, Rounding,
                      tuple[TensorToTensor, ...]]


def base_error_energy(base: Base, name: str) -> float:
    """``|e|^2`` of the base's ``name``: the squared error its header records (``mse`` times the
    element count), 0 where it records none (an exact tensor)."""
    stored = base.stored(name)
    if stored is None:
        return 0.0
    record = stored.extra.get("error")
    mse = record.get("mse") if isinstance(record, dict) else None
    if not isinstance(mse, (int, float)) or not (math.isfinite(mse) and mse > 0):
        return 0.0
    return float(mse) * math.prod(stored.shape)


def decoded_nonzero(encoded: Encoded) -> torch.Tensor:
    """Where a k-means-coded array decodes non-zero, as a reader sees it (a centroid may round
    to zero): its codes looked up in the codebook's non-zero flags."""
    quantizer = encoded.pipeline.transforms[-1]
    assert isinstance(quantizer, KMeans)
    codes = encoded.array
    flags = quantizer.table(codes.device) != 0
    if bool(flags[1:].all()):  # no centroid rounds to zero: the non-zero codes, one pass
        return codes != 0
    return flags[codes.long()]


def sqrt_error(logs: np.ndarray, fit: Fit) -> float:
    """The RMS relative error of ``sqrt(v)`` when the ascending ``logs`` of ``v`` are replaced
    by their clusters' centroids: an error ``e`` in ``log(v)`` makes ``sqrt(v)`` wrong by a
    factor ``exp(e / 2)``, which for the small values of a wide spread is far above ``e / 2``."""
    if not logs.size:
        return 0.0
    assigned = np.repeat(fit.centroids, fit.counts)
    return float(np.sqrt(np.mean(np.expm1((assigned - logs) / 2) ** 2)))


def decoded_sqrt_error_norm(array: torch.Tensor, decoded: torch.Tensor) -> float:
    """The L2 norm of ``sqrt(v^ / v) - 1`` over the elements where ``v`` (``array``) is positive,
    its squares summed in float64 (as :func:`~.common.magnitude` sums them). As ``(v^ - v) / (v
    (sqrt(v^ / v) + 1))`` it keeps float32's relative precision however small ``v`` is: ``v^ -
    v`` is exact where the two are within a factor of two. One native pass on the host (IEEE
    float32, the same on every CPU), torch's ops on a device (its square root may differ by an
    ulp: the check, not what a reader decodes)."""
    stored = hostpath.cast(array, torch.float32).contiguous()
    restored = hostpath.cast(decoded, torch.float32).contiguous()
    if native(stored, restored):
        return math.sqrt(_native.sqrt_error_squares(flat_array(stored),
                                                    flat_array(restored)))

    def relative(v: torch.Tensor, v_hat: torch.Tensor) -> torch.Tensor:
        positive = v > 0
        v, v_hat = torch.where(positive, v, 1.0), torch.where(positive, v_hat, 1.0)
        return (v_hat - v) / (v * ((v_hat / v).sqrt() + 1))

    return math.sqrt(hostpath.sum_squares(relative, stored, restored))


def zero_pattern_bits(base: torch.Tensor) -> float:
    """The order-0 entropy, in bits, of where ``base`` is zero: ``n H(zeros / n)``."""
    n = base.numel()
    zeros = n - hostpath.count_nonzero(base)
    if not 0 < zeros < n:
        return 0.0
    p = zeros / n
    return -n * (p * math.log2(p) + (1 - p) * math.log2(1 - p))


class AdaptivePolicy(JointPolicy):
    mode = "adaptive"
    #: SGD's momentum buffer is coded as a first moment, like ``exp_avg``.
    state_roles = MOMENTUM_ROLES

    def __init__(self, error_budget: float | Mapping[str, float] | None = None,
                 pairing: Mapping[str, int | str] | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, scope: str = "floats",
                 keep_exact: Sequence[str] = (), joint_restart: bool | None = None,
                 ratio_coding: bool = True, step_coding: bool = True) -> None:
        super().__init__(pairing, chunk_bytes, scope, keep_exact)
        for option, given in (("ratio_coding", ratio_coding), ("step_coding", step_coding)):
            if type(given) is not bool:
                raise ConfigError(f"adaptive: {option} must be True or False, not {given!r}")
        # exp_avg as Adam's step, m / sqrt(v^) with v^ the exp_avg_sq as decoded (the
        # sqrt-scale stage), its error bounded in that domain, wherever exp_avg_sq is coded
        # beside it at every element (not where both moments restart)
        self.step_coding = step_coding
        # exp_avg_sq as its ratio to the base's decoded exp_avg_sq (the base-ratio stage), where
        # that needs no more centroids than the value itself, within the same budget
        self.ratio_coding = ratio_coding
        if joint_restart is not None and type(joint_restart) is not bool:
            raise ConfigError(f"adaptive: joint_restart must be True, False or None (by the "
                              f"optimizer's beta2), not {joint_restart!r}")
        # Zero exp_avg_sq where exp_avg is pruned (both moments restart), stored at exp_avg's
        # support. By default (None) only where the optimizer's beta2 is at most
        # JOINT_RESTART_BETA2: an element whose second moment restarts from zero takes Adam
        # steps of about (1 - beta1^k) / sqrt(k (1 - beta2)) learning rates for k steps after
        # (1.3 at k = 5 with beta2 = 0.999), where its steady state is a fraction of one; on the
        # fidelity matrix's LoRA fine-tune (AdamW defaults) the validation loss went from 3.5 to
        # 12 within 30 steps. Under beta2 = 0.95 the second moment recovers within a few dozen
        # steps, and a pruned exp_avg beside a kept exp_avg_sq slows its element instead
        # (+0.75% on the 0.44M GPT against -0.02% restarted; docs/LOSSY.md).
        self.joint_restart = joint_restart
        self.budget = dict(DEFAULT_BUDGET)
        # exp_avg's default differs where both moments restart (RESTART_EXP_AVG_BUDGET); a
        # budget the caller gives holds everywhere
        self.exp_avg_budget_given = error_budget is not None and (
            not isinstance(error_budget, Mapping) or "exp_avg" in error_budget)
        if isinstance(error_budget, Mapping):
            unknown = set(error_budget) - set(STATES)
            if unknown:
                raise ConfigError(f"adaptive: error_budget keys must be among {STATES}, not {unknown}")
            self.budget.update(error_budget)
        elif error_budget is not None:
            self.budget = dict.fromkeys(STATES, error_budget)
        if not all(type(b) in (int, float) and math.isfinite(b) and b >= 0
                   for b in self.budget.values()):
            raise ConfigError(f"adaptive: error budgets must be finite numbers >= 0, not "
                              f"{error_budget!r}")
        if self.budget["weight"] >= MAX_WEIGHT_BUDGET:
            raise ConfigError(
                f"adaptive: a weight budget of {self.budget['weight']} (>= {MAX_WEIGHT_BUDGET}) "
                f"lets a chain's error grow at every checkpoint where training left a tensor "
                f"alone; give less (default {DEFAULT_BUDGET['weight']})")

    def reads_v_base(self, leaves: list[Leaf], values: GroupValues) -> bool:
        """With the ratio coding, except where ``exp_avg_sq`` is stored at ``exp_avg``'s support
        (:meth:`_v_at_support`), never as a ratio: decoding the base's would be for nothing."""
        return self.ratio_coding and not self._v_at_support(leaves, values)

    def _v_at_support(self, leaves: list[Leaf], values: GroupValues) -> bool:
        """Whether :meth:`plan_group` stores ``exp_avg_sq`` only where ``exp_avg`` decodes
        non-zero: both moments are coded here, of one shape, and restart jointly."""
        group = values.group
        return (group.exp_avg is not None and values.m is not None and values.v is not None
                and values.m.shape == values.v.shape
                and self._restarts_jointly(leaves[group.exp_avg]))

    @property
    def carried(self) -> float:
        """How much of their base's error this checkpoint's weight updates carry: none when
        training resumed from the base as decoded, all when it went on from the true state."""
        return 0.0 if self.resumed else 1.0

    def plan_group(self, leaves: list[Leaf], values: GroupValues,
                   base: Base) -> dict[int, Encoded | Exact]:
        group, plans = values.group, {}
        if values.weight is not None and values.w is not None and values.w_base is not None:
            assert group.weight is not None
            plans.update(self._weight(group.weight, values.weight, values.w, values.w_base,
                                      base))
        restarts = group.exp_avg is not None and self._restarts_jointly(leaves[group.exp_avg])
        at_support = self._v_at_support(leaves, values)
        v_decoded = None  # exp_avg_sq as a reader decodes it, where it is coded first
        if group.exp_avg_sq is not None and values.v is not None and not at_support:
            plans[group.exp_avg_sq], v_decoded = self._second_moment(
                leaves[group.exp_avg_sq], values.v, None, v_base=values.v_base)
        if group.exp_avg is not None and values.m is not None:
            budget = (RESTART_EXP_AVG_BUDGET if restarts and not self.exp_avg_budget_given
                      else None)
            step = None
            if (self.step_coding and group.exp_avg_sq is not None and v_decoded is not None
                    and v_decoded.shape == values.m.shape):
                step = self._step(group.exp_avg, leaves[group.exp_avg], values.m,
                                  group.exp_avg_sq, v_decoded)
            plans[group.exp_avg] = step if step is not None else self._quantize(
                leaves[group.exp_avg], values.m, magnitude(values.m) ** 2, "exp_avg",
                budget=budget)
        if group.exp_avg_sq is not None and values.v is not None and at_support:
            assert group.exp_avg is not None
            m_plan = plans[group.exp_avg]
            # where exp_avg decodes non-zero (exact: its own non-zeros)
            kept = (decoded_nonzero(m_plan) if isinstance(m_plan, Encoded)
                    else leaves[group.exp_avg].tensor.detach() != 0)
            plans[group.exp_avg_sq] = self._second_moment(
                leaves[group.exp_avg_sq], values.v, kept.to(values.v.device), group.exp_avg)[0]
        return plans

    def _step(self, index: int, leaf: Leaf, m: torch.Tensor, v_index: int,
              v_decoded: torch.Tensor) -> Encoded | None:
        """``exp_avg`` as Adam's step ``u = m / sqrt(v^)`` (``v^`` the ``exp_avg_sq`` a reader
        decodes, leaf ``v_index``), pruned and quantized within ``exp_avg``'s budget of ``|u|``
        (:data:`STEP_EXP_AVG_BUDGET` by default), read back by the ``sqrt-scale`` stage. None
        where an element of ``m`` has no step (a non-zero moment over a zero ``v^``) or no
        candidate keeps the bound: the moment is then coded as itself."""
        steps = step_quotients(m, v_decoded)
        if steps is None:
            return None
        norm = magnitude(steps)
        scale_sq = norm**2
        if not math.isfinite(scale_sq):  # a quotient past float32's range (a huge moment over a
            return None  # denormal v^): the moment is coded as itself
        step_leaf = dataclasses.replace(leaf, tensor=steps)  # the bound is checked on the step
        budget = None if self.exp_avg_budget_given else STEP_EXP_AVG_BUDGET
        plan = self._quantize(step_leaf, steps, scale_sq, "exp_avg", budget=budget)
        if not isinstance(plan, Encoded):
            return None
        scale = SqrtScale(v_index, leaf.dtype.name)
        if leaf.dtype.itemsize < 4:
            # the stage rounds the product to the moment's dtype: in fp32 that moves the step's
            # error by an ulp (2^-24 of it), in bf16 by up to 2^-9, so there the record and the
            # bound are taken again on what a reader decodes
            context = TransformContext(leaf.name, siblings={v_index: v_decoded})
            moment = scale.decode(undo(plan.pipeline.transforms, plan.array, context), context)
            decoded = step_quotients(moment, v_decoded)
            assert decoded is not None  # a non-zero moment only where v^ is positive
            record = plan.extra["error"]
            budget = record["budget"]
            fresh = error_record(steps, decoded, bound=budget * norm, norm=norm, kept=record["kept"])
            if not fresh.pop("within"):
                return None
            record.update(fresh)
        plan.pipeline = dataclasses.replace(plan.pipeline,
                                            transforms=(scale, *plan.pipeline.transforms))
        plan.extra["error"]["domain"] = "step"
        return plan

    def _restarts_jointly(self, exp_avg: Leaf) -> bool:
        """Whether this moment's pruned elements restart both moments: as asked, else where
        the state's optimizer says its ``beta2`` is at most :data:`JOINT_RESTART_BETA2`."""
        if self.joint_restart is not None:
            return self.joint_restart
        key = moment_key(exp_avg)
        beta2 = None if key is None else self.betas.get(key)
        return beta2 is not None and beta2 <= JOINT_RESTART_BETA2

    def _weight(self, index: int, leaf: Leaf, w: torch.Tensor, w_base: torch.Tensor,
                base: Base) -> dict[int, Encoded | Exact]:
        """The weight's update, rounded without bias within its budget (:mod:`.factoring`),
        after the product of two added factor leaves where that is cheaper
        (:class:`~ckptzip.codecs.LowRank`), with the elements it left alone kept exact (an added
        change mask, :class:`~ckptzip.codecs.ExactZeros`); pruned and quantized like a moment
        where the budget is too tight for a grid a uint8 code addresses; bit-exact where
        neither keeps the bound (a budget of 0, or a tensor too small for its error to average
        out). The bound, ``budget * sqrt(scale_sq)``, is checked on what a reader decodes; a
        rounding that misses it (unbiased rounding bounds the *expected* error) is drawn again
        on a finer grid."""
        budget = self.budget["weight"]
        if base.stored(leaf.name) is None:
            budget = min(budget, UNRECORDED_BASE_BUDGET)
        delta = hostpath.subtract(w, w_base)
        scale_sq = energy = magnitude(delta) ** 2
        inherited = self.carried * base_error_energy(base, leaf.name)
        if inherited > 0:  # the budget is relative to the update, not to the base's error
            scale_sq = max(energy - inherited, UPDATE_FLOOR * energy)
        bound = budget * math.sqrt(scale_sq)
        if not bound > 0:
            return {index: Exact()}
        changed = delta != 0
        partial = not bool(changed.all())
        if partial:  # -0.0 counts as unchanged, and is coded as +0.0: in place (delta is ours)
            delta.masked_fill_(~changed, 0)
        for attempt, tighter in enumerate(RETRY_BUDGETS):
            plans = self._rounded_weight(index, leaf, delta, changed if partial else None, w_base,
                                         scale_sq, budget * tighter, bound, attempt)
            if plans == {}:
                break  # no grid of uint8 codes: a finer one would not fit either
            if plans is not None:
                self.add_leaf(len(plans) - 1)  # the added leaves' indices are taken now
                plans[index].extra["error"].update(budget=budget)
                if inherited > 0:
                    plans[index].extra["error"]["carried"] = float(f"{inherited / max(energy, 1e-300):.3g}")
                return dict(plans)
        quantized = self._quantize(leaf, delta, scale_sq, "weight", residual=True, base=w_base,
                                   budget=budget)
        return {index: quantized}

    def _rounded_weight(self, index: int, leaf: Leaf, delta: torch.Tensor,
                        changed: torch.Tensor | None, w_base: torch.Tensor, scale_sq: float,
                        target: float, bound: float, attempt: int) -> dict[int, Encoded] | None:
        """One try of :meth:`_weight`: the plans (the weight's, and its added leaves' at the
        next free indices, not yet taken) when the decoded error keeps ``bound``; None when it
        does not, and no plans when no grid of uint8 codes serves the budget. ``changed``: where
        the update is non-zero, when it is zero somewhere."""
        first = self.next_leaf()
        zeros = None
        plans: dict[int, Encoded] = {}
        if changed is not None:
            packed = pack_changed(changed)
            zeros = (ExactZeros(first), packed)
            mask = Leaf(f"{leaf.name}:changed", (*leaf.path, ":changed"), from_name("uint8"),
                        (packed.numel(),), packed)
            plans[first] = Encoded(coded((), packed), packed, added=mask)
            first += 1
        active = None if changed is None else hostpath.count_nonzero(changed)
        factored = factor_update(delta, scale_sq, target)
        residual = delta if factored is None else factored.residual
        if factored is not None and changed is not None:
            # decoded as zero whatever is stored; in place: the residual is this try's own
            residual.masked_fill_(~changed, 0)
        seed = zlib.crc32(f"{leaf.name}:{scale_sq:.6e}:{attempt}".encode()) if attempt else (
            zlib.crc32(f"{leaf.name}:{scale_sq:.6e}".encode()))
        rounded = self._rounded(leaf, residual, scale_sq, target, seed, active)
        if rounded is None and factored is not None:
            factored = None
            rounded = self._rounded(leaf, delta, scale_sq, target, seed, active)
        if rounded is None:
            return {}
        values, codes, quantizer, rounding, stages = rounded
        # the residual is rounded and not read again: let go of it (a weight's bytes) before
        # the weight's decoding below, where a group's peak lies on a device
        rank = 0 if factored is None else factored.rank
        pair = None if factored is None else (factored.u, factored.v)
        del rounded, residual, factored
        lowrank = None
        if pair is not None:
            factors = LowRank(first, first + 1)
            lowrank = (factors, {factors.u: pair[0].decoded, factors.v: pair[1].decoded})
            for j, which, factor in ((factors.u, "u", pair[0]), (factors.v, "v", pair[1])):
                added = Leaf(f"{leaf.name}:lowrank.{which}", (*leaf.path, f":lowrank.{which}"),
                             from_name("float32"), tuple(factor.decoded.shape), factor.decoded)
                plans[j] = finish(added, factor.pruned, factor.quantizer, codes=factor.codes)
                plans[j].added = added
                del plans[j].extra["error"]  # the weight's record covers its factors
        stored = codes if values is None else values  # the codes stand for the values
        assert stored is not None
        plans[index] = finish(leaf, stored, quantizer, residual=True, base=w_base, codes=codes,
                              lowrank=lowrank, zeros=zeros, rounding=stages, bound=bound)
        if not honoured(plans[index]):
            return None
        finished(plans[index])
        plans[index].extra["error"].update(
            quantizer="dithered" if rounding.dithered else "stochastic",
            step=float(f"{rounding.step:.4g}"),
            rank=rank)
        return plans

    def _rounded(self, leaf: Leaf, array: torch.Tensor, scale_sq: float, budget: float, seed: int,
                 active: int | None) -> RoundedUpdate | None:
        """``array`` rounded without bias within ``budget`` (of ``sqrt(scale_sq)``), the
        cheaper of stochastically and with a dither (:func:`.factoring.roundings`): the values
        the ``kmeans`` stage stores (dither included), that stage, the rounding, and the dither
        stage if any; None when no grid fits a uint8 code. The draws are seeded by the tensor's
        name and update, so a save is reproducible and consecutive checkpoints draw afresh. The
        update's energy enters with 7 significant digits: its last bits depend on the order of
        the sum, which differs between devices. ``active``: the elements an
        :class:`~ckptzip.codecs.ExactZeros` mask leaves to be coded (all by default)."""
        for rounding in cheapest_roundings(array, scale_sq, budget, seed, active, BOUND_SIGMAS):
            quantizer = grid(rounding, leaf.dtype.name)
            if quantizer is not None:
                stages: tuple[TensorToTensor, ...] = (
                    (Dither(seed, rounding.step),) if rounding.dithered else ())
                codes = rounding.codes()
                values = ((rounding.levels.double() * rounding.step).to(array.dtype)
                          if codes is None else None)
                return values, codes, quantizer, rounding, stages
        return None

    def _quantize(self, leaf: Leaf, array: torch.Tensor, scale_sq: float, state: str, *,
                  residual: bool = False, base: torch.Tensor | None = None,
                  budget: float | None = None) -> Encoded | Exact:
        """Prune and quantize within ``budget`` (by default the state's) of ``sqrt(scale_sq)``,
        checked on the decoded tensor; bit-exact when no candidate keeps it. A debiased
        codebook is rescaled after the fit, which grows a least-squares error ``e`` to
        ``e / sqrt(1 - e**2)`` (relative): the fit aims at ``budget / sqrt(1 + budget**2)``."""
        budget = self.budget[state] if budget is None else budget
        bound = budget * math.sqrt(scale_sq)
        if not bound > 0:
            return Exact()
        # e / sqrt(1 + e^2), as hypot: e * e overflows past 1.3e154, and the aim became 0
        aim = budget / math.hypot(1.0, budget) if state in DEBIASED else budget
        for tighter in RETRY_BUDGETS:
            encoded = self._fit(leaf, array, scale_sq, state, aim * tighter, residual, base, bound)
            if honoured(encoded):
                finished(encoded)
                encoded.extra["error"]["budget"] = budget
                return encoded
        return Exact()

    def _fit(self, leaf: Leaf, array: torch.Tensor, scale_sq: float, state: str, aim: float,
             residual: bool, base: torch.Tensor | None, bound: float) -> Encoded:
        choice, quantizer, pruned = fitted(array, scale_sq, aim, leaf.dtype.name)
        least_squares, codes = None, None
        if state in DEBIASED and bool((pruned != 0).any()):
            # least-squares levels shrink the reconstruction: its projection onto the original
            # falls short by the error's energy. Scaling the codebook (the codes stay) restores
            # the projection, what the state moves training by, at a larger L2 error.
            context = TransformContext(leaf.name)
            codes = quantizer.encode(pruned, context)
            rebuilt = quantizer.decode(codes, context)
            # the projection <r, x> by polarization, from three native sums in float64
            error_sq = distance(rebuilt, array) ** 2
            original_sq = magnitude(array) ** 2
            projection = (magnitude(rebuilt) ** 2 + original_sq - error_sq) / 2
            del rebuilt  # finish decodes the codes again: on a device the group's peak is there
            least_squares = math.sqrt(error_sq / max(scale_sq, 1e-300))
            if projection > 0:
                quantizer.scale_table(original_sq / projection)
        encoded = finish(leaf, pruned, quantizer, residual=residual, base=base, codes=codes,
                         bound=bound)
        encoded.extra["error"]["quantizer"] = "uniform" if choice.step > 0 else "kmeans"
        if least_squares is not None:
            encoded.extra["error"]["rel_ls"] = float(f"{least_squares:.4g}")
        return encoded

    def _second_moment(self, leaf: Leaf, v: torch.Tensor, kept: torch.Tensor | None,
                       sibling: int | None = None,
                       v_base: torch.Tensor | None = None,
                       ) -> tuple[Encoded | Exact, torch.Tensor]:
        """``exp_avg_sq`` where ``exp_avg`` is kept, zero elsewhere (both moments restart there,
        as ExCP's joint mask makes them), quantized in the log domain with the fewest centroids
        that keep ``sqrt(v)`` within the budget, checked on every stored value (the search
        looks at a sample); bit-exact when 255 centroids do not. With ``sibling`` (the leaf
        index of ``exp_avg``, whose decoded non-zeros are ``kept``), only the values there are
        stored: the mask is not paid for twice; ``kept`` None: all of ``v``'s non-zeros. ``v``
        is only read. The plan, and what a reader decodes from it (``v`` itself where it is
        bit-exact: ``kept`` is then all of ``v``'s non-zeros or the caller does not read it)."""
        budget = self.budget["exp_avg_sq"]
        # kept None: all of v's own non-zeros, where v * (v != 0) is v itself (the group is
        # finite), so no copy is made
        array = v if kept is None else v * kept
        stored = nonzero_values(array.reshape(-1))  # v >= 0: its non-zeros are the positives
        count = stored.numel()
        # the value's fits read a sample alone: the tensor-sized rest is let go of now, before
        # the ratio's temporaries (on a device, a group's peak is there)
        sample = sample_sorted(stored)
        del stored

        def value_sizes() -> Iterator[int]:
            # one centroid: the mask alone, where v varies little; each size is fitted only when
            # the smaller ones did not keep the budget (lazily: the fits of large codebooks cost
            # most), and the values' logs only taken when a size is asked for
            logs = np.log(sample)  # the log is monotone: sorted still
            yield from (size for size in (1, *CODEBOOKS) if size == CODEBOOKS[-1]
                        or sqrt_error(logs, lloyd_sorted(logs, size)) <= budget)

        sizes = value_sizes()
        # (the ratio or None: the value, size), drawn as tried: the first that keeps the budget
        # ends the search, so the codebooks after it are never fitted
        first: list[tuple[torch.Tensor | None, int]] = []
        ratios, stage = None, None
        if v_base is not None and sibling is None:
            stage = BaseRatio(leaf.dtype.name)
            ratios = base_ratios(array, v_base)
            fill = zero_fill(v_base) if ratios is None else None
            if fill is not None:  # a value over a zero base (a token first seen since the base)
                stage = FilledBaseRatio(leaf.dtype.name, fill)
                ratios = base_ratios(array, v_base, fill)
        # the ratio's codes with the base's zeros first (an embedding's rows of tokens not yet
        # seen, zero in both): the reader knows where they are, so they cost next to nothing
        partition = (BasePartition() if ratios is not None and v_base is not None
                     and zero_pattern_bits(v_base) >= 8 * PARTITION_MIN_BYTES else None)
        if ratios is not None:
            # the ratios are non-zero exactly where v is positive (a float32 over a float32 does
            # not underflow float64)
            ratio_logs = np.log(sample_sorted(nonzero_values(ratios.reshape(-1))))
            ratio_size = next(size for size in (1, *CODEBOOKS) if size == CODEBOOKS[-1]
                              or sqrt_error(ratio_logs, lloyd_sorted(ratio_logs, size)) <= budget)
            # the ratio where it needs no more centroids than the value (it is then the
            # narrower distribution, so its codes are the cheaper ones too), the value after
            value_size = ratio_size if ratio_size == 1 else next(sizes)
            if ratio_size <= value_size:
                first = [(ratios, size) for size in (1, *CODEBOOKS) if size >= ratio_size]
            sizes = iter(size for size in (1, *CODEBOOKS) if size >= value_size)
        for ratio, size in itertools.chain(first, ((None, size) for size in sizes)):
            quantizer = KMeans(size, leaf.dtype.name, "log")
            if ratio is not None:
                encoded, decoded = finish_decoded(leaf, ratio, quantizer, ratio=stage,
                                                  partition=partition, base=v_base)
            elif sibling is None:
                encoded, decoded = finish_decoded(leaf, array, quantizer)
            else:
                assert kept is not None  # a sibling's support is always passed
                encoded, decoded = finish_decoded(leaf, array, quantizer,
                                                  support=(Support(sibling), kept))
            # sqrt(v^ / v) - 1 where v is stored (0 elsewhere), its RMS
            norm = decoded_sqrt_error_norm(array, decoded)
            error = math.sqrt(norm ** 2 / count) if count else 0.0
            if error <= budget and honoured(encoded):
                finished(encoded)
                encoded.extra["error"].update(rel_sqrt=float(f"{error:.4g}"), budget=budget,
                                              domain="ratio" if ratio is not None else "value")
                return encoded, decoded
        return Exact(), v
