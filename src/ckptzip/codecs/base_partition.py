"""Tensor to tensor, against a base: the elements where the base is zero first, then the rest.

A fine-tune's embedding has a second moment of zero in every row of a token not yet seen, and
after the log-domain codebook of its ratio to the base (:mod:`.base_ratio`) its codes are zero
exactly there, but for the tokens first seen since. In C order those zero rows interleave with
the others, and the entropy coder pays for the pattern at every element: on the MiniLM fine-tune
of docs/BENCHMARKS.md §5, 72% of the embedding's elements are such zeros, about 0.86 bits of each
element's 1.1. Partitioned by the base's zeros, which the reader has, those codes form a run of
their own that the chunks code in next to nothing, and the others no longer pay for the pattern.

Encoding: the flat array's elements where the base (the base checkpoint's *decoded* leaf of the
same name) is zero, in C order, then the others, in C order: a 1-D array of as many elements.
Decoding scatters them back into the base's shape. The values are not touched.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from .. import hostpath
from .base import TensorToTensor, TransformContext, register


@register
class BasePartition(TensorToTensor):
    codec_id: ClassVar[str] = "base-partition"

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BasePartition:
        return cls()

    def _zeros(self, context: TransformContext, device: torch.device) -> torch.Tensor:
        if context.base is None:
            raise ValueError(f"{self.codec_id}: {context.name} needs its base tensor")
        return (context.base.reshape(-1) == 0).to(device)

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        context.base_of(self.codec_id, tensor.shape)  # the base's shape is the tensor's
        zeros = self._zeros(context, tensor.device)
        flat = tensor.reshape(-1)
        return torch.cat((flat[zeros], flat[~zeros]))

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        zeros = self._zeros(context, tensor.device)
        if tensor.dim() != 1 or tensor.numel() != zeros.numel():
            raise ValueError(f"{self.codec_id}: {context.name}: {tensor.numel()} stored elements "
                             f"for a base of {zeros.numel()}")
        assert context.base is not None
        out = tensor.new_empty(context.base.shape)
        flat = out.view(-1)
        count = hostpath.count_nonzero(zeros)
        flat[zeros] = tensor[:count]
        flat[~zeros] = tensor[count:]
        return out
