"""Tensor to tensor: exact zeros where a sibling mask says an element did not change.

A lossy update is rounded without bias (a dither, stochastic rounding) and may have a low-rank
product subtracted: both make an element whose update was exactly zero decode to something else,
so that an embedding row no batch touched, or a bf16 weight too small to move, would drift with
every checkpoint. This stage keeps those elements exact: the positions that changed are a sibling
leaf of packed bits (``numel / 8`` bytes, most significant bit first, as ``numpy.packbits``
packs them), entropy-coded like any leaf, which costs next to nothing when zeros are rare or
come in runs. Decoding sets every element the mask does not mark to zero; encoding does the
same, so the stages after it may code those elements however is cheapest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from .. import _native
from ..errors import ConfigError
from ..hostpath import flat_array, native
from .base import InPlaceDecoding, TransformContext, register
from .support import MAX_LEAF_INDEX

_SHIFTS = torch.arange(7, -1, -1, dtype=torch.uint8)


def pack_changed(changed: torch.Tensor) -> torch.Tensor:
    """A bool tensor as packed bits (uint8, ``ceil(numel / 8)`` bytes, first element in the most
    significant bit), on its device."""
    flat = changed.reshape(-1)
    padded = torch.zeros(-(-flat.numel() // 8) * 8, dtype=torch.uint8, device=flat.device)
    padded[: flat.numel()] = flat.to(torch.uint8)
    return (padded.reshape(-1, 8) << _SHIFTS.to(flat.device)).sum(1, dtype=torch.uint8)


def unpack_changed(packed: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` bits of :func:`pack_changed`'s bytes, as bools."""
    bits = (packed.reshape(-1, 1) >> _SHIFTS.to(packed.device)) & 1
    return bits.reshape(-1)[:count].bool()


@register
class ExactZeros(InPlaceDecoding):
    codec_id: ClassVar[str] = "zeros"

    def __init__(self, leaf: int) -> None:
        if type(leaf) is not int or not 0 <= leaf < MAX_LEAF_INDEX:
            raise ConfigError(f"zeros: leaf must be a leaf index (int >= 0), not {leaf!r}")
        self.leaf = leaf

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "leaf": self.leaf}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ExactZeros:
        return cls(config["leaf"])

    @property
    def references(self) -> tuple[int, ...]:
        return (self.leaf,)

    def added_leaves(self, name: str) -> dict[int, str]:
        return {self.leaf: f"{name}:changed"}

    def renumbered(self, numbers: Mapping[int, int]) -> ExactZeros:
        return ExactZeros(numbers.get(self.leaf, self.leaf))

    def sibling_problem(self, shape: tuple[int, ...], siblings: dict[int, tuple[str, tuple[int, ...]]],
                        ) -> str | None:
        count = 1
        for side in shape:
            count *= side
        dtype, found = siblings[self.leaf]
        if dtype != "uint8" or found != (-(-count // 8),):
            return (f"its change mask is {dtype} {list(found)}, not the uint8 [{-(-count // 8)}] "
                    f"of packed bits its {count} elements need")
        return None

    def _changed(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        packed = (context.siblings or {}).get(self.leaf)
        if packed is None:
            raise ValueError(f"zeros: {context.name} needs its decoded change mask (leaf {self.leaf})")
        if packed.dtype != torch.uint8 or packed.numel() != -(-tensor.numel() // 8):
            raise ValueError(f"zeros: {context.name}'s change mask holds {packed.numel()} "
                             f"{packed.dtype} values for {tensor.numel()} elements")
        return unpack_changed(packed.to(tensor.device), tensor.numel()).reshape(tensor.shape)

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        return self._keep_changed(tensor, context)

    def decoded(self, tensor: torch.Tensor, context: TransformContext, *,
                in_place: bool) -> torch.Tensor:
        return self._keep_changed(tensor, context, in_place)

    def _keep_changed(self, tensor: torch.Tensor, context: TransformContext,
                      in_place: bool = False) -> torch.Tensor:
        """``tensor`` with +0.0 where the mask says unchanged: one native pass over the packed
        mask for float32 on the host (``in_place``: into the tensor's memory where it is
        contiguous), torch's ``masked_fill`` of the unpacked one elsewhere."""
        packed = (context.siblings or {}).get(self.leaf)
        if (packed is not None and tensor.dtype == torch.float32 and native(tensor, packed)
                and packed.dtype == torch.uint8
                and packed.numel() == -(-tensor.numel() // 8)):
            out = self.output(tensor, tensor, torch.float32, in_place)
            _native.keep_changed(flat_array(tensor),
                                 flat_array(packed), flat_array(out))
            return out
        return tensor.masked_fill(~self._changed(tensor, context), 0)
