"""Tensor to tensor: a faint, known, zero-mean noise added on decoding (a lossy weight's mark).

**Decode only, for files written before ckptzip 0.2**: the adaptive mode no longer writes it.
Decoding adds ``amount * w * step``, with ``w`` uniform in (-1/2, 1/2), drawn from the seed by the
dither's hash (:func:`~ckptzip.codecs.dither.offsets` of ``seed ^ MARK_KEY``), so independent of
the data, of the rounding and of a dither. Encoding leaves the tensor as it is: the mark is not
coded, it is part of the reconstruction's error, ``amount**2 * step**2 / 12`` per element.

It was deliberate noise on every weight, there only so that the next save could guess from its
update whether training resumed from the reconstruction; that is now stated instead
(``ckptzip.save(..., resumed=)``, which :class:`ckptzip.CheckpointManager` passes). The golden
file ``tests/golden/lossy/v1.0-adaptive-mark.ckz`` pins its decoding.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ..errors import ConfigError
from .base import TensorToTensor, TransformContext, register
from .dither import check_seed_and_step, finite_number, scaled_offsets

#: Mixed into the seed for the mark's draws, so that they are independent of a dither's.
MARK_KEY = 0x5BD1E995


@register
class Mark(TensorToTensor):
    codec_id: ClassVar[str] = "mark"

    def __init__(self, seed: int, step: float, amount: float) -> None:
        check_seed_and_step(self.codec_id, seed, step)
        if not (finite_number(amount) and 0 < amount < 1):
            raise ConfigError(f"mark: amount must be a number in (0, 1), not {amount!r}")
        self.seed = seed
        self.step = float(step)
        self.amount = float(amount)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "seed": self.seed, "step": self.step, "amount": self.amount}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Mark:
        return cls(config["seed"], config["step"], config["amount"])

    def pattern(self, shape: torch.Size | tuple[int, ...], device: torch.device) -> torch.Tensor:
        """``w * step`` for each element of a tensor of ``shape`` (float64); the reconstruction
        holds ``amount`` of it."""
        return scaled_offsets(shape, self.seed ^ MARK_KEY, self.step, device)

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        return tensor

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        if not tensor.is_floating_point():
            raise ValueError(f"mark: {context.name} decodes to {tensor.dtype}, not floats")
        dtype = torch.promote_types(tensor.dtype, torch.float32)
        marked = tensor.double() + self.amount * self.pattern(tensor.shape, tensor.device)
        return marked.to(dtype)
