"""Tensor to tensor, against a base: the log-ratio of a positive tensor to its base's value.

Adam's second moment changes by a factor, not by an amount, and what matters to training is its
square root, by which Adam divides. So ``exp_avg_sq`` is coded as ``log(v / v_base) - shift``:
zero means "the base's value times ``exp(shift)``", where ``shift`` (stored in the config) is the
tensor's typical drift since the base. Zeros must sit where the base is zero too, and stay zero.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from .. import dtypes
from ..errors import ConfigError
from .base import TensorToTensor, TransformContext, register


@register
class LogRatio(TensorToTensor):
    codec_id: ClassVar[str] = "log-ratio"

    def __init__(self, dtype: str, shift: float = 0.0) -> None:
        out = dtypes.from_name(dtype)
        if out.kind != "float":
            raise ConfigError(f"log-ratio: dtype {dtype!r} is not a real float type")
        if type(shift) not in (int, float) or not math.isfinite(shift):
            raise ConfigError(f"log-ratio: bad shift {shift!r}")
        self.dtype, self.shift = out, float(shift)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "dtype": self.dtype.name, "shift": self.shift}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LogRatio:
        return cls(config["dtype"], config["shift"])

    @staticmethod
    def applies(tensor: torch.Tensor, base: torch.Tensor) -> bool:
        """Whether ``tensor`` can be coded against ``base``: both non-negative, zero together."""
        return bool(((tensor > 0) == (base > 0)).all()) and bool((tensor >= 0).all())

    def _base(self, shape: torch.Size, context: TransformContext) -> torch.Tensor:
        base = context.base
        if base is None or tuple(base.shape) != tuple(shape):
            raise ValueError(f"log-ratio: {context.name} needs its base tensor of shape {list(shape)}")
        return base.double()

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        """Fits the shift (the median log-ratio) and returns the rest (float32)."""
        base = self._base(tensor.shape, context).to(tensor.device)
        positive = base > 0
        ratio = torch.zeros(tensor.shape, dtype=torch.float64, device=tensor.device)
        ratio[positive] = tensor.double()[positive].log() - base[positive].log()
        self.shift = float(ratio[positive].median()) if bool(positive.any()) else 0.0
        ratio[positive] -= self.shift
        return ratio.float()

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        base = self._base(tensor.shape, context).to(tensor.device)
        if bool((base < 0).any()):
            raise ValueError("log-ratio: the base has negative values")
        assert self.dtype.torch_dtype is not None
        return (base * (tensor.double() + self.shift).exp()).to(self.dtype.torch_dtype)
