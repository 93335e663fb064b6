"""What the lossy modes share: the joint plan over weight groups, pipelines, error records."""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..chain import Base
from ..codecs import (
    BytePlanes,
    Entropy,
    KMeans,
    LossyResidual,
    LowRank,
    Support,
    TensorToTensor,
    TransformContext,
)
from ..dtypes import from_torch
from ..pipeline import Pipeline
from ..policy import DEFAULT_CHUNK_BYTES, Encoded, LosslessPolicy, Planned
from ..tree import Leaf
from .pairing import Group, group_state


class NonFiniteWarning(UserWarning):
    """A weight or moment held NaN or infinite values, so a lossy mode stored it bit-exact."""


@dataclass
class GroupValues:
    """One weight group's tensors in float32 on their device (None where absent)."""

    group: Group
    #: The weight's leaf, when the base has a tensor of its dtype and shape to code it against.
    weight: Leaf | None
    w: torch.Tensor | None
    #: The base's reconstruction of the weight.
    w_base: torch.Tensor | None
    m: torch.Tensor | None
    v: torch.Tensor | None


def coded(stages: tuple[TensorToTensor, ...], array: torch.Tensor) -> Pipeline:
    """The pipeline that entropy-codes ``array`` after ``stages``: byte planes for floats, plain
    for uint8 codes."""
    width, rotate = from_torch(array.dtype, "").plane_layout
    serializer = BytePlanes(width, rotate) if width > 1 else None
    return Pipeline(transforms=stages, serializer=serializer, compressors=(Entropy(),))


def error_record(original: torch.Tensor, decoded: torch.Tensor, **more: float) -> dict[str, float]:
    """The achieved error, for the header: MSE and the relative L2 error ``|x^ - x| / |x|``."""
    diff = (decoded.double() - original.double()).reshape(-1)
    norm = float(original.double().norm())
    error = float(diff.norm())
    record = {"mse": float(diff.pow(2).mean()) if diff.numel() else 0.0,
              "rel": error / norm if norm else float(error > 0)}
    record.update(more)
    return {k: float(f"{v:.4g}") for k, v in record.items()}


def delta_error(original: torch.Tensor, decoded: torch.Tensor, base: torch.Tensor) -> float:
    """The error relative to the update since the base: ``|x^ - x| / |x - base|``."""
    update = float((original.double() - base.double()).norm())
    error = float((decoded.double() - original.double()).norm())
    return error / update if update else float(error > 0)


def decode(stages: tuple[TensorToTensor, ...], array: torch.Tensor,
           context: TransformContext) -> torch.Tensor:
    """What a reader will decode from ``array`` (run the stages backwards)."""
    for stage in reversed(stages):
        array = stage.decode(array, context)
    return array


_ROLES = (
    ("norm", re.compile(r"(^|[._])(ln|norm|layernorm|rmsnorm|bn)[^.]*[._]", re.I)),
    ("bias", re.compile(r"\.bias$")),
    ("embedding", re.compile(r"(embed|wte|wpe|tok|lm_head|pos_emb)", re.I)),
    ("attention", re.compile(r"(attn|attention|q_proj|k_proj|v_proj|o_proj|query|key|value)", re.I)),
    ("mlp", re.compile(r"(mlp|fc|ffn|feed_forward|up_proj|down_proj|gate_proj|dense|c_proj)", re.I)),
)


def role_of(name: str, ndim: int) -> str:
    """The tensor's role in the network, from its name: embedding, attention, mlp, norm or bias
    (1-D tensors are norms or biases), else ``other``."""
    for role, pattern in _ROLES:
        if pattern.search(name) and (role in ("norm", "bias") or ndim >= 2):
            return role
    return "bias" if ndim <= 1 else "other"


class JointPolicy(LosslessPolicy):
    """A lossy mode: each group of a weight and its moments is planned together against the base.

    The first checkpoint of a chain (no base) stays lossless: a keyframe.
    """

    def __init__(self, pairing: Mapping[str, int] | None = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> None:
        super().__init__(chunk_bytes)
        self.pairing = pairing
        self._next_leaf = 0

    def plan_state(self, leaves: list[Leaf], base: Base | None,
                   progress: Planned | None = None) -> dict[int, Encoded]:
        if base is None:
            return {}
        plans: dict[int, Encoded] = {}
        self._next_leaf = len(leaves)
        groups = self.groups(leaves, base)
        self.survey(leaves, groups, base)
        sizes = [sum(leaves[i].nbytes for i in (v.group.weight, v.group.exp_avg, v.group.exp_avg_sq)
                     if i is not None) for v in groups]
        for values, size in zip(groups, sizes):
            plans.update(self.plan_group(leaves, values, base))
            if progress is not None:
                progress(size, sum(sizes))
        return plans

    def survey(self, leaves: list[Leaf], groups: list[GroupValues], base: Base) -> None:
        """Look at every group before any is planned (what holds for the whole checkpoint);
        nothing by default."""

    def add_leaf(self) -> int:
        """The index of a leaf the plan adds to the file (after the state's own and those
        added before it)."""
        index = self._next_leaf
        self._next_leaf += 1
        return index

    def groups(self, leaves: list[Leaf], base: Base) -> list[GroupValues]:
        """Each weight group's values, but for groups with NaN or infinite values (here or in
        the base), which are left to the writer to code on their own, bit-exact, with a
        :class:`NonFiniteWarning`."""
        finite = []
        for group in group_state(leaves, self.pairing, self.mode):
            values = self._values(leaves, group, base)
            tensors = (values.w, values.w_base, values.m, values.v)
            if all(bool(torch.isfinite(t).all()) for t in tensors if t is not None):
                finite.append(values)
                continue
            names = ", ".join(leaves[i].name for i in (group.weight, group.exp_avg,
                                                       group.exp_avg_sq) if i is not None)
            warnings.warn(f"{names}: NaN or infinite values (here or in the base); stored "
                          f"lossless, not as {self.mode} deltas", NonFiniteWarning, stacklevel=3)
        return finite

    def plan_group(self, leaves: list[Leaf], values: GroupValues, base: Base) -> dict[int, Encoded]:
        raise NotImplementedError

    @staticmethod
    def _values(leaves: list[Leaf], group: Group, base: Base) -> GroupValues:
        def get(index: int | None) -> torch.Tensor | None:
            return None if index is None else leaves[index].tensor.detach().float()

        weight = None if group.weight is None else leaves[group.weight]
        w_base = None
        if weight is not None:
            found = base.tensor(weight.name)
            if found is not None and (found.dtype, found.shape) == (weight.dtype, weight.shape):
                w_base = base.value(weight.name).to(weight.tensor.device).float()
            else:
                weight = None
        return GroupValues(group, weight, get(group.weight) if weight else None, w_base,
                           get(group.exp_avg), get(group.exp_avg_sq))


def finish(
    leaf: Leaf, array: torch.Tensor, quantizer: KMeans | None, *, residual: bool = False,
    base: torch.Tensor | None = None, original: torch.Tensor | None = None,
    support: tuple[Support, torch.Tensor] | None = None, codes: torch.Tensor | None = None,
    lowrank: tuple[LowRank, dict[int, torch.Tensor]] | None = None,
    rounding: tuple[TensorToTensor, ...] = (), **more: float,
) -> Encoded:
    """Store ``array`` (pruned elements zero; a residual against ``base`` when ``residual``;
    only at a sibling's non-zeros with ``support``, its stage and that mask), through
    ``quantizer`` (needed unless ``residual``), and record the error of what a reader will
    decode against ``original`` (the leaf by default). ``codes``: the quantizer's codes of
    ``array``, where the caller fixed them (a codebook rescaled after assigning them).
    ``lowrank``: the stage and its decoded factors by leaf index, when ``array`` is already
    what is left after their product. ``rounding``: the stages of an unbiased rounding before
    the quantizer (a :class:`~ckptzip.codecs.Mark`, a :class:`~ckptzip.codecs.Dither` whose
    shift ``array`` already holds)."""
    stages: tuple[TensorToTensor, ...] = (LossyResidual(leaf.dtype.name),) if residual else ()
    context = TransformContext(leaf.name, base, None if support is None else support[1],
                               None if lowrank is None else lowrank[1])
    if lowrank is not None:
        stages = (*stages, lowrank[0])
    stages = (*stages, *rounding)
    if support is not None:
        stages = (*stages, support[0])
        array = support[0].encode(array, context)
    if quantizer is not None:
        array = quantizer.encode(array, context) if codes is None else codes
        stages = (*stages, quantizer)
    decoded = decode(stages, array, context)
    reference = leaf.tensor if original is None else original
    kept = int((array != 0).sum())
    more.setdefault("kept", kept / reference.numel() if reference.numel() else 0.0)
    if residual and base is not None:
        more["rel_delta"] = delta_error(reference, decoded, base)
    return Encoded(coded(stages, array), array, {"error": error_record(reference, decoded, **more)},
                   uses_base=residual)
