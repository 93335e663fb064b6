"""``mode="bitsnap"``: BitSnap (arXiv 2511.12376): bitmask sparsification of the model-state
delta, cluster quantization of the optimizer states, adapted to the training stage and each
tensor's role.

* Model states: the delta against the base's reconstruction keeps its largest ``density``
  fraction of elements; the mask (a bitmask, or an index list below 3% density) is entropy-coded
  and the kept values are stored as half-precision numbers (:class:`ckptzip.codecs.Sparse`).
* Optimizer states: 8-bit k-means (255 clusters; ``exp_avg_sq`` in the log domain, where its
  wide range lives), every element kept.
* Adaptation (below ``density=1``, which keeps every changed element): the kept fraction
  starts from ``density`` and scales with the tensor's role (norms and biases are kept whole,
  embeddings at half), with the learning-rate phase (more during
  warmup, less while it decays: the phase is read from the trend of the effective step size
  ``rms(dW) / rms(exp_avg / sqrt(exp_avg_sq))`` per optimizer step, against the base's), and
  with the tensor's update size relative to the whole model's; it never exceeds the fraction of
  elements that changed at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from .. import hostpath
from ..chain import Base
from ..codecs import KMeans, LossyResidual, Sparse, TensorToTensor, TransformContext, undo
from ..codecs.sparse import layout_for
from ..errors import ConfigError
from ..hostpath import native
from ..policy import DEFAULT_CHUNK_BYTES, Encoded, Exact
from ..reader import FileBase
from ..tree import Leaf
from .common import (
    NO_WORSE,
    GroupValues,
    JointPolicy,
    by_task,
    coded,
    delta_error,
    device_gate,
    distance,
    error_record,
    finish,
    finished,
    group_bytes,
    magnitude,
    role_of,
)

#: Kept fraction per role, as a multiple of ``density``.
ROLE_SCALE = {"norm": math.inf, "bias": math.inf, "embedding": 0.5, "attention": 1.0, "mlp": 1.0,
              "other": 1.0}
PHASE_SCALE = {"warmup": 1.5, "stable": 1.0, "decay": 0.75, "unknown": 1.0}
#: Relative change of the effective step size that marks warmup or decay.
PHASE_TREND = 0.1
ADAM_EPS = 1e-8


@dataclass
class Stage:
    """Where training is, measured from the state and its base."""

    #: Fraction of weight elements that differ from the base.
    changed: float
    #: ``|dW| / |W|`` over all weights.
    rel_update: float
    #: ``rms(dW) / rms(exp_avg / sqrt(exp_avg_sq))`` per optimizer step (0 if unknown).
    step_size: float
    phase: str


class BitsnapPolicy(JointPolicy):
    mode = "bitsnap"

    def __init__(self, density: float = 1.0, moment_bits: int = 8,
                 pairing: Mapping[str, int | str] | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, scope: str = "floats",
                 keep_exact: Sequence[str] = ()) -> None:
        if (type(density) not in (int, float) or not 0 < density <= 1
                or type(moment_bits) is not int or not 1 <= moment_bits <= 8):
            raise ConfigError(f"bitsnap: need 0 < density <= 1 and moment_bits in 1..8, not "
                              f"{density!r}, {moment_bits!r}")
        super().__init__(pairing, chunk_bytes, scope, keep_exact)
        self.density, self.centroids = density, 2**moment_bits - 1
        self.stage: Stage | None = None

    def survey(self, leaves: list[Leaf], groups: list[GroupValues], base: Base,
               threads: int = 1) -> None:
        self.stage = measure_stage(leaves, groups, base, threads)

    def plan_group(self, leaves: list[Leaf], values: GroupValues,
                   base: Base) -> dict[int, Encoded | Exact]:
        assert self.stage is not None
        group = values.group
        plans: dict[int, Encoded | Exact] = {}
        if values.weight is not None and values.w is not None and values.w_base is not None:
            assert group.weight is not None
            plans[group.weight] = self._sparsify(values.weight, values.w, values.w_base)
        for index, moment, domain in ((group.exp_avg, values.m, "linear"),
                                      (group.exp_avg_sq, values.v, "log")):
            if index is not None and moment is not None:
                quantizer = KMeans(self.centroids, leaves[index].dtype.name, domain, "fp16")
                plans[index] = finished(finish(leaves[index], moment, quantizer))
        return plans

    def _sparsify(self, leaf: Leaf, w: torch.Tensor, w_base: torch.Tensor) -> Encoded | Exact:
        """Keep the largest elements of the update (its error is at most what storing none of
        it leaves, :data:`~.common.NO_WORSE`; a plan that misses that is stored bit-exact)."""
        assert self.stage is not None
        delta = hostpath.subtract(w, w_base).reshape(-1)
        role = role_of(leaf.name, len(leaf.shape))
        changed = float((delta != 0).float().mean())
        delta_norm, weight_norm = float(delta.norm()), float(w.norm())
        if not (math.isfinite(delta_norm) and math.isfinite(weight_norm)):  # past float32's range
            delta_norm, weight_norm = magnitude(delta), magnitude(w)
        rel = delta_norm / max(weight_norm, 1e-30)
        size_scale = min(2.0, max(0.5, math.sqrt(rel / self.stage.rel_update))) if (
            self.stage.rel_update > 0) else 1.0
        density = min(changed, self.density * ROLE_SCALE[role] * PHASE_SCALE[self.stage.phase]
                      * size_scale)
        if self.density >= 1:
            # density 1 keeps every changed element: the scales only share out a smaller kept
            # fraction. At 1 they dropped about 5% of the changed elements (x0.75 while the
            # learning rate decays, x0.5 on embeddings and small updates), which cost +0.25% of
            # validation loss on the fidelity matrix's 0.44M GPT against a 0.23% noise floor
            density = changed
        keep = round(density * delta.numel())
        kept = changed  # the fraction of non-zeros in what is stored, unless pruned below
        if 0 < keep < delta.numel():
            threshold = hostpath.kth_magnitude(delta, delta.numel() - keep - 1)
            delta = delta * (delta.abs() > threshold)
            kept = float((delta != 0).float().mean())
        elif keep == 0:
            delta = torch.zeros_like(delta)
            kept = float((delta != 0).float().mean())
        residual = LossyResidual(leaf.dtype.name)
        sparse = Sparse(layout_for(density), str(residual.compute_dtype).removeprefix("torch."),
                        list(leaf.shape))
        stages: tuple[TensorToTensor, ...] = (residual, sparse)
        context = TransformContext(leaf.name, w_base)
        array = sparse.encode(delta.reshape(leaf.shape), context)
        del delta  # stored: on a device the decoding below is the group's peak
        decoded = undo(stages, array, context)  # what a reader will decode
        update, error = distance(leaf.tensor, w_base), distance(decoded, leaf.tensor)
        bound = NO_WORSE * update
        rel_delta = delta_error(error, update)
        extra: dict[str, Any] = {
            "error": error_record(leaf.tensor, decoded, kept=kept, rel_delta=rel_delta, bound=bound,
                                  error=error, update=update),
            "policy": {"role": role, "density": float(f"{density:.4g}"), **_rounded(asdict(self.stage))},
        }
        return finished(Encoded(coded(stages, array), array, extra, uses_base=True))


def _rounded(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in fields.items()}


#: One group's share of the stage: changed and total weight elements, the update's and the
#: weight's energy, and (with both moments) the mean square of the update and of Adam's direction.
_GroupStage = tuple[int, int, float, float, float | None, float | None]


def _group_stage(values: GroupValues) -> _GroupStage | None:
    """A weight group's share of :func:`measure_stage` (None without a weight and its base).
    Its weight-sized temporaries are two, the update and a scratch buffer, written by torch's
    own kernels (``out=`` and in place: the same values as the plain expressions). On the host
    the scratch is a ``hostpath.empty`` buffer (no fresh allocation, and its page faults, per
    step); on a device, the group holds two of its weight's bytes at the peak, not five."""
    if values.w is None or values.w_base is None:
        return None
    w, m, v = values.w, values.m, values.v
    delta = hostpath.subtract(w, values.w_base.to(w.device))  # one group's base at a time
    scratch = None
    if delta.dtype == w.dtype and delta.shape == w.shape:
        scratch = hostpath.empty(w.shape, w.dtype) if native(w) else torch.empty_like(w)
    squares = delta.pow(2) if scratch is None else torch.pow(delta, 2, out=scratch)
    changed, delta_sq = hostpath.count_nonzero(delta), float(squares.sum())
    # squares past float32's range (values beyond 1.8e19) make an infinite sum: those groups
    # are summed in float64 instead (the others keep their figures, and their files)
    if not math.isfinite(delta_sq):
        delta_sq = magnitude(delta) ** 2
    moves = None
    if m is not None and v is not None:
        mean_sq = float(squares.mean())
        if not math.isfinite(mean_sq):
            mean_sq = delta_sq / delta.numel()
        if scratch is None or not (m.shape == v.shape == delta.shape
                                   and m.dtype == v.dtype == delta.dtype
                                   and m.device == v.device == delta.device):
            direction = (m / (v.sqrt() + ADAM_EPS)).pow(2)
        else:  # m / (sqrt(v) + eps), squared: the same steps, in the delta's buffer
            direction = torch.sqrt(v, out=delta).add_(ADAM_EPS)
            direction = torch.div(m, direction, out=direction).pow_(2)
        moves = (mean_sq, float(direction.mean()))
    weight_sq = float((w.pow(2) if scratch is None else torch.pow(w, 2, out=scratch)).sum())
    if not math.isfinite(weight_sq):
        weight_sq = magnitude(w) ** 2
    return (changed, w.numel(), delta_sq, weight_sq, *(moves or (None, None)))


def measure_stage(leaves: list[Leaf], groups: list[GroupValues], base: Base,
                  threads: int = 1) -> Stage:
    """The training stage: how much changed, how big the update is, and the LR phase. The groups
    are measured on ``threads`` threads (each sum on one of torch's: the same figures on any
    count) and summed in their order; on a device, under the planning's gate (those measured at
    once hold a share of the state's memory, as when they are planned)."""
    changed = total = 0
    delta_sq = weight_sq = 0.0
    delta_rms, direction_rms = [], []
    members = [values.group for values in groups]
    sizes = [group_bytes(leaves, group) for group in members]
    # as the groups' plans run: the large ones first, the small ones together on one thread
    # (taken one by one, they are mostly the GIL's, and two threads handing it to each other
    # measured slower on two threads than on one)
    found_stages = dict(by_task(lambda position: _group_stage(groups[position]), sizes, threads,
                                device_gate(leaves, members, sizes)))
    for position in range(len(groups)):
        found = found_stages[position]
        if found is None:
            continue
        group_changed, group_total, group_delta_sq, group_weight_sq, mean_sq, direction_sq = found
        changed += group_changed
        total += group_total
        delta_sq += group_delta_sq
        weight_sq += group_weight_sq
        if mean_sq is not None and direction_sq is not None:
            delta_rms.append(mean_sq)
            direction_rms.append(direction_sq)
    steps = _steps_between(leaves, base)
    step_size = 0.0
    if direction_rms and sum(direction_rms) > 0 and steps:
        step_size = math.sqrt(sum(delta_rms) / sum(direction_rms)) / steps
    previous = _previous_step_size(base)
    phase = "unknown"
    if step_size and previous:
        trend = step_size / previous - 1
        phase = "warmup" if trend > PHASE_TREND else "decay" if trend < -PHASE_TREND else "stable"
    return Stage(changed / total if total else 0.0,
                 math.sqrt(delta_sq / weight_sq) if weight_sq else 0.0, step_size, phase)


def _steps_between(leaves: list[Leaf], base: Base) -> int:
    """Optimizer steps since the base, from the first Adam ``step`` counter (0 if none)."""
    for leaf in leaves:
        if leaf.path[-1:] == ("step",) and "state" in leaf.path and leaf.numel == 1:
            found = base.tensor(leaf.name)
            if found is not None and found.shape == leaf.shape:
                return int(float(leaf.tensor.reshape(-1)[0]) - float(base.value(leaf.name).reshape(-1)[0]))
    return 0


def _previous_step_size(base: Base) -> float:
    """The step size the base checkpoint measured, when it is a bitsnap file."""
    if not isinstance(base, FileBase):
        return 0.0
    for leaf in base.checkpoint.leaves:
        policy = leaf.extra.get("policy")
        if isinstance(policy, dict) and isinstance(policy.get("step_size"), (int, float)):
            return float(policy["step_size"])
    return 0.0
