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
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from .. import _native, dtypes, hostpath
from ..errors import ConfigError
from ..hostpath import native, native_float32
from .base import TensorToTensor, TransformContext, register


def base_ratios(tensor: torch.Tensor, base: torch.Tensor) -> torch.Tensor | None:
    """``tensor / base`` in float64, 0 where ``tensor`` is zero (``base`` of its shape, on its
    device), or None where an element has no ratio: a non-zero element over a base element that
    is zero, negative or not finite."""
    if native_float32(tensor, base):  # one native pass, the same arithmetic
        ratios = hostpath.empty(tensor.shape, torch.float64)
        has_ratios = _native.base_ratios(tensor.contiguous().reshape(-1).numpy(),
                                     base.contiguous().reshape(-1).numpy(), ratios.reshape(-1).numpy())
        return ratios if has_ratios else None
    usable = torch.isfinite(base) & (base > 0)
    if bool(((tensor != 0) & ~usable).any()):
        return None
    ratios = torch.empty(tensor.shape, dtype=torch.float64, device=tensor.device)
    return hostpath.in_pieces(lambda t, b: torch.where(t == 0, 0.0, t.double() / b.double()),
                              ratios, tensor, base)


@register
class BaseRatio(TensorToTensor):
    codec_id: ClassVar[str] = "base-ratio"

    def __init__(self, dtype: str) -> None:
        out = dtypes.from_name(dtype)
        if out.kind != "float":
            raise ConfigError(f"base-ratio: dtype {dtype!r} is not a real float type")
        self.dtype = out

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "dtype": self.dtype.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BaseRatio:
        return cls(config["dtype"])

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        ratios = base_ratios(tensor, context.base_of(self.codec_id, tensor.shape).to(tensor.device))
        if ratios is None:
            raise ValueError(f"base-ratio: {context.name}: a non-zero element over a base element "
                             f"that is zero, negative or not finite")
        return ratios

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        base = context.base_of(self.codec_id, tensor.shape).to(tensor.device)
        assert self.dtype.torch_dtype is not None
        if (self.dtype.torch_dtype == torch.float32 and native_float32(base)
                and native(tensor) and tensor.dtype in (torch.float32, torch.float64)
                and tensor.numel() == base.numel()):
            ratios = tensor.contiguous()
            out = hostpath.empty(tensor.shape, torch.float32)
            _native.ratio_restore(ratios.reshape(-1).numpy(), ratios.element_size(),
                                  base.contiguous().reshape(-1).numpy(), out.reshape(-1).numpy())
            return out
        dtype = self.dtype.torch_dtype

        def restore(b: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            product = (b.double() * t.double()).to(dtype)
            return torch.where(t == 0, torch.zeros_like(product), product)

        out = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)
        return hostpath.in_pieces(restore, out, base, tensor)  # small float64 copies
