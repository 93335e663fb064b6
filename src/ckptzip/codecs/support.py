"""Tensor to tensor: only the elements where another tensor of the same checkpoint is non-zero.

ExCP's joint pruning and the adaptive policy zero Adam's ``exp_avg_sq`` wherever ``exp_avg`` was
pruned, so both moments of an element restart together. Stored whole, the second moment would
pay for that mask a second time (its code 0 marks the same positions as the first moment's),
which can be all it costs: with one centroid, its codes *are* the mask. This stage keeps the
values at the support of a *sibling* leaf, ``leaf`` (an index into the header's leaves), as a
1-D array, and scatters them back into zeros on decoding.

The support is that of the sibling *as decoded*, so writer and reader derive the same positions.
A sibling must have the tensor's shape and no support of its own (chains of supports are
refused, which also rules out cycles).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from .. import _native, hostpath
from ..errors import ConfigError
from ..hostpath import flat_array, native
from .base import TensorToTensor, TransformContext, register

#: Leaves a header may hold is far below this; a larger index is a damaged config.
MAX_LEAF_INDEX = 1 << 31


@register
class Support(TensorToTensor):
    codec_id: ClassVar[str] = "support"

    def __init__(self, leaf: int) -> None:
        if type(leaf) is not int or not 0 <= leaf < MAX_LEAF_INDEX:
            raise ConfigError(f"support: leaf must be a leaf index (int >= 0), not {leaf!r}")
        self.leaf = leaf

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "leaf": self.leaf}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Support:
        return cls(config["leaf"])

    @property
    def references(self) -> tuple[int, ...]:
        return (self.leaf,)

    @property
    def support_leaf(self) -> int | None:
        return self.leaf

    @staticmethod
    def _mask(context: TransformContext) -> torch.Tensor:
        if context.support is None:
            raise ValueError(f"support: {context.name} needs the decoded sibling it is stored beside")
        return context.support

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        mask = self._mask(context).to(tensor.device)
        if tuple(mask.shape) != tuple(tensor.shape):
            raise ConfigError(f"support: {context.name} has shape {list(tensor.shape)}, its "
                              f"sibling {list(mask.shape)}")
        if _native_pair(tensor, mask):  # one native pass: the check and the gather
            source, flags = tensor.contiguous(), mask.contiguous()
            out = hostpath.empty((hostpath.count_nonzero(flags),), source.dtype)
            try:
                _native.mask_gather(flat_array(source),
                                    flags.reshape(-1).view(torch.uint8).numpy(), out.numpy(),
                                    source.element_size())
            except ValueError:
                raise ConfigError(f"support: {context.name} is non-zero outside its sibling's "
                                  "support") from None
            return out
        if bool(tensor.masked_fill(mask, 0).any()):  # one pass, nothing gathered
            raise ConfigError(f"support: {context.name} is non-zero outside its sibling's support")
        return tensor[mask]

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        """Scatter the stored values into zeros of the sibling's shape (the reader has checked
        that it is the tensor's own)."""
        mask = self._mask(context).to(tensor.device)
        if tensor.dim() == 1 and _native_pair(tensor, mask):
            values, flags = tensor.contiguous(), mask.contiguous()
            out = hostpath.empty(tuple(mask.shape), values.dtype)
            if _native.mask_scatter(values.numpy(), flags.reshape(-1).view(torch.uint8).numpy(),
                                    flat_array(out), values.element_size()):
                return out
        if tensor.dim() != 1 or tensor.numel() != int(torch.count_nonzero(mask)):
            raise ValueError(f"support: {tensor.numel()} stored values for a support of "
                             f"{int(torch.count_nonzero(mask))} elements")
        out = tensor.new_zeros(mask.shape)
        out[mask] = tensor
        return out


def _native_pair(values: torch.Tensor, mask: torch.Tensor) -> bool:
    """Whether the native passes take ``values`` and its boolean ``mask``: both on the host,
    float32 or float64 values."""
    return (native(values, mask) and mask.dtype == torch.bool
            and values.dtype in (torch.float32, torch.float64))
