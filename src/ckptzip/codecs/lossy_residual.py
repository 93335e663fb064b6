"""Tensor to tensor, against a base: the arithmetic difference from the base's reconstruction.

Lossy modes code a tensor as ``new - base`` in floating point (fp32, or fp64 for fp64 tensors),
where ``base`` is the *decoded* base checkpoint, so that the errors of a chain do not add up
(closed loop, as in ExCP). Later stages prune and quantize the difference; decoding adds it back
to the base and casts to the tensor's dtype, and keeps the base's bits wherever the decoded
difference is zero, so that an element training did not move comes back exactly.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from .. import _native, dtypes, hostpath
from ..errors import ConfigError
from ..hostpath import flat_array, native
from .base import InPlaceDecoding, TransformContext, register


@register
class LossyResidual(InPlaceDecoding):
    codec_id: ClassVar[str] = "lossy-residual"

    def __init__(self, dtype: str) -> None:
        out = dtypes.from_name(dtype)
        if out.kind != "float":
            raise ConfigError(f"lossy-residual: dtype {dtype!r} is not a real float type")
        self.dtype = out

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "dtype": self.dtype.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LossyResidual:
        return cls(config["dtype"])

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype.itemsize == 8 else torch.float32

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        base = context.base_of(self.codec_id, tensor.shape).to(tensor.device, self.compute_dtype)
        return tensor.to(self.compute_dtype) - base

    def decoded(self, tensor: torch.Tensor, context: TransformContext, *,
                in_place: bool) -> torch.Tensor:
        """The base plus the difference, and the base's own bits where the difference is zero
        (``-0.0 + 0.0`` would give ``+0.0``): an element the update left alone decodes exactly
        (in place where the difference is contiguous float32)."""
        exact = context.base_of(self.codec_id, tensor.shape).to(tensor.device)
        assert self.dtype.torch_dtype is not None
        exact = exact.to(self.dtype.torch_dtype)
        delta = tensor.to(self.compute_dtype)
        if (self.dtype.torch_dtype == torch.float32 and native(exact, delta)
                and exact.numel() == delta.numel()):
            # one native pass, the same bits (base_of gave the base the difference's shape)
            out = self.output(tensor, delta, torch.float32, in_place)
            _native.residual_add(flat_array(exact),
                                 flat_array(delta), flat_array(out))
            return out
        compute, dtype = self.compute_dtype, self.dtype.torch_dtype

        def add(e: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
            return torch.where(d == 0, e, (e.to(compute) + d).to(dtype))

        out = torch.empty(exact.shape, dtype=dtype, device=exact.device)
        return hostpath.in_pieces(add, out, exact, delta)
