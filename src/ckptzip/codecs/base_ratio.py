"""Tensor to tensor, against a base: the ratio to the base's reconstruction (Adam's second
moments).

Between two checkpoints ``exp_avg_sq`` moves mostly by a factor shared by its elements (``beta2``
per step, and what the new gradients add), so its ratio to the base's *decoded* value spans a far
narrower range than the value itself: on the fidelity matrix's 10.75M GPT, five steps apart, the
RMS of ``log sqrt(v / v_base)`` about its median is 0.09, where the values span decades. A
log-domain codebook of the ratio then needs a centroid or two where one of the value needs
dozens. Coding against the decoded base keeps the chain's error from adding up (closed loop).

Encoding: ``x / base`` in float64 where ``x`` is non-zero, 0 where it is zero. An element with a
non-zero ``x`` over a base that is zero, negative or not finite has no ratio: the encoder refuses
it (:func:`base_ratios` gives None, for a policy to code the tensor another way). Decoding: 0 where the
ratio is 0, else ``base * r`` in float64 (exact for an fp32 base and an fp32 ratio, as the kmeans
stage decodes), rounded once to ``dtype``: the same bits on any device.

:class:`FilledBaseRatio` (``base-ratio-filled``) takes a base element that is zero as ``fill``
(a positive number it stores), in encoding and decoding alike. A fine-tune's embedding has a
second moment of zero in every row of a token not yet seen; a token first seen since the base
has no ratio to a zero, and without the fill its whole tensor had to be coded as values (on the
MiniLM fine-tune of docs/BENCHMARKS.md §5, a third of a delta's bytes).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from .. import _native, dtypes, hostpath
from ..errors import ConfigError
from ..hostpath import flat_array, native, native_float32
from .base import InPlaceDecoding, TransformContext, register


def filled(base: torch.Tensor, fill: float | None) -> torch.Tensor:
    """``base`` with each zero taken as ``fill`` (a copy; ``base`` itself without a fill)."""
    if fill is None:
        return base
    if native(base):  # into reused host memory (hostpath.empty)
        out = hostpath.empty(base.shape, base.dtype)
        return out.copy_(base).masked_fill_(base == 0, fill)
    return base.masked_fill(base == 0, fill)


def zero_fill(base: torch.Tensor) -> float | None:
    """The value :class:`FilledBaseRatio` takes for ``base``'s zeros: the median of its positive
    elements (a ratio to it is about the spread of the values around it), in ``base``'s dtype;
    None where no element is positive."""
    positive = base[base > 0]
    if not positive.numel():
        return None
    return float(positive.median())


def base_ratios(tensor: torch.Tensor, base: torch.Tensor,
                fill: float | None = None) -> torch.Tensor | None:
    """``tensor / base`` in float64, 0 where ``tensor`` is zero (``base`` of its shape, on its
    device), or None where an element has no ratio: a non-zero element over a base element that
    is zero, negative or not finite. ``fill``: a zero base element is taken as ``fill``."""
    if native_float32(tensor, base):  # one native pass, the same arithmetic
        ratios = hostpath.empty(tensor.shape, torch.float64)
        has_ratios = _native.base_ratios(flat_array(tensor),
                                         filled(base.contiguous(), fill).reshape(-1).numpy(),
                                         flat_array(ratios))
        return ratios if has_ratios else None
    usable = torch.isfinite(base) & ((base > 0) if fill is None else (base >= 0))
    if bool(((tensor != 0) & ~usable).any()):
        return None
    ratios = torch.empty(tensor.shape, dtype=torch.float64, device=tensor.device)
    return hostpath.in_pieces(
        lambda t, b: torch.where(t == 0, 0.0, t.double() / filled(b, fill).double()),
        ratios, tensor, base)


@register
class BaseRatio(InPlaceDecoding):
    codec_id: ClassVar[str] = "base-ratio"

    #: The value a zero base element is taken as (:class:`FilledBaseRatio`); None: none is.
    fill: float | None = None

    def __init__(self, dtype: str) -> None:
        out = dtypes.from_name(dtype)
        if out.kind != "float":
            raise ConfigError(f"{self.codec_id}: dtype {dtype!r} is not a real float type")
        self.dtype = out

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "dtype": self.dtype.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BaseRatio:
        return cls(config["dtype"])

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        ratios = base_ratios(tensor, context.base_of(self.codec_id, tensor.shape).to(tensor.device),
                             self.fill)
        if ratios is None:
            kinds = "zero, negative" if self.fill is None else "negative"
            raise ValueError(f"{self.codec_id}: {context.name}: a non-zero element over a base "
                             f"element that is {kinds} or not finite")
        return ratios

    def decoded(self, tensor: torch.Tensor, context: TransformContext, *,
                in_place: bool) -> torch.Tensor:
        """The tensor from its ratios (in place where they are contiguous float32)."""
        base = filled(context.base_of(self.codec_id, tensor.shape).to(tensor.device), self.fill)
        assert self.dtype.torch_dtype is not None
        if (self.dtype.torch_dtype == torch.float32 and native_float32(base)
                and native(tensor) and tensor.dtype in (torch.float32, torch.float64)
                and tensor.numel() == base.numel()):
            ratios = tensor.contiguous()
            out = self.output(tensor, ratios, torch.float32, in_place)
            _native.ratio_restore(flat_array(ratios), ratios.element_size(),
                                  flat_array(base), flat_array(out))
            return out
        dtype = self.dtype.torch_dtype

        def restore(b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            product = (b.double() * t.double()).to(dtype)
            return torch.where(t == 0, torch.zeros_like(product), product)

        out = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)
        return hostpath.in_pieces(restore, out, base, tensor)  # small float64 copies


@register
class FilledBaseRatio(BaseRatio):
    """:class:`BaseRatio` with each zero element of the base taken as ``fill`` (finite, > 0, and
    exactly a value of the tensor's dtype), so that an element that is non-zero over a zero base
    has a ratio too. A codec of its own: a reader that knows only ``base-ratio`` refuses the
    file instead of decoding those elements as zero."""

    codec_id: ClassVar[str] = "base-ratio-filled"

    def __init__(self, dtype: str, fill: float) -> None:
        super().__init__(dtype)
        assert self.dtype.torch_dtype is not None
        if (type(fill) not in (int, float) or not 0 < fill < float("inf")
                or float(torch.tensor(fill, dtype=self.dtype.torch_dtype)) != fill):
            raise ConfigError(f"{self.codec_id}: fill must be a finite positive {self.dtype.name} "
                              f"value, not {fill!r}")
        self.fill = float(fill)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "dtype": self.dtype.name, "fill": self.fill}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FilledBaseRatio:
        return cls(config["dtype"], config["fill"])
