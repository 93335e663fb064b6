"""Tensor to tensor: what a low-rank product of two sibling leaves leaves over.

The update of a weight matrix between two checkpoints is close to low rank: on the fidelity
model a rank of 8-24 holds 80-95% of its energy (docs/LOSSY.md). The adaptive mode stores such an
update as two small factor matrices, ``U`` (rows x r) and ``V`` (columns x r), each a leaf of its
own that the state tree does not reference, plus the residual ``x - U V^T``, quantized like any
update. This stage subtracts the product on encoding and adds it back on decoding; the factors
are the *decoded* factor leaves, so writer and reader compute the same product.

A tensor of more than two dimensions is taken as a matrix of its first dimension by the rest.
The factor leaves must not depend on other leaves themselves (the reader refuses chains).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from .. import hostpath
from ..errors import ConfigError
from .base import TensorToTensor, TransformContext, register
from .support import MAX_LEAF_INDEX


@register
class LowRank(TensorToTensor):
    codec_id: ClassVar[str] = "lowrank"

    def __init__(self, u: int, v: int) -> None:
        for what, leaf in (("u", u), ("v", v)):
            if type(leaf) is not int or not 0 <= leaf < MAX_LEAF_INDEX:
                raise ConfigError(f"lowrank: {what} must be a leaf index (int >= 0), not {leaf!r}")
        if u == v:
            raise ConfigError(f"lowrank: u and v name the same leaf ({u})")
        self.u = u
        self.v = v

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "u": self.u, "v": self.v}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LowRank:
        return cls(config["u"], config["v"])

    @property
    def references(self) -> tuple[int, ...]:
        return (self.u, self.v)

    def added_leaves(self, name: str) -> dict[int, str]:
        return {self.u: f"{name}:lowrank.u", self.v: f"{name}:lowrank.v"}

    def renumbered(self, numbers: Mapping[int, int]) -> LowRank:
        return LowRank(numbers.get(self.u, self.u), numbers.get(self.v, self.v))

    def sibling_problem(self, shape: tuple[int, ...],
                        siblings: dict[int, tuple[str, tuple[int, ...]]]) -> str | None:
        u, v = siblings[self.u][1], siblings[self.v][1]
        if self.fits(shape, u, v):
            return None
        rows, columns = self.sides(shape)
        return (f"low-rank factors {list(u)} and {list(v)} are not matrices of a rank <= "
                f"{min(rows, columns)} for a {rows} x {columns} tensor")

    def product(self, shape: torch.Size | tuple[int, ...], context: TransformContext,
                dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """``U V^T`` as a tensor of ``shape``; ValueError when the factors do not fit it."""
        factors: Mapping[int, torch.Tensor] = context.siblings or {}
        u, v = factors.get(self.u), factors.get(self.v)
        if u is None or v is None:
            raise ValueError(f"lowrank: {context.name} needs its decoded factor leaves "
                             f"{self.u} and {self.v}")
        if not self.fits(tuple(shape), tuple(u.shape), tuple(v.shape)):
            rows, columns = self.sides(tuple(shape))
            raise ValueError(f"lowrank: factors {list(u.shape)} and {list(v.shape)} do not make a "
                             f"{rows} x {columns} matrix of a rank <= {min(rows, columns)}")
        return hostpath.matmul(u.to(device, dtype), v.to(device, dtype).T).reshape(shape)

    @staticmethod
    def sides(shape: tuple[int, ...]) -> tuple[int, int]:
        """The tensor as a matrix: its first dimension by the product of the rest."""
        return (shape[0] if shape else 1), math.prod(shape[1:])

    @classmethod
    def fits(cls, shape: tuple[int, ...], u: tuple[int, ...], v: tuple[int, ...]) -> bool:
        """Whether factors of shapes ``u`` and ``v`` are ``rows x r`` and ``columns x r`` for a
        tensor of ``shape``, with ``r`` at most the smaller side (so the product costs no more
        than ``rows * columns * min(rows, columns)``)."""
        rows, columns = cls.sides(shape)
        return (len(u) == 2 and len(v) == 2 and u[0] == rows and v[0] == columns
                and u[1] == v[1] <= min(rows, columns))

    # Both directions work in at least fp32 (a bf16 weight's residual decodes to bf16 codes'
    # values), so the product the writer subtracts is the one the reader adds.
    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        dtype = torch.promote_types(tensor.dtype, torch.float32)
        return hostpath.subtract(tensor.to(dtype), self.product(tensor.shape, context, dtype,
                                                                 tensor.device))

    def decode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        if not tensor.is_floating_point():
            raise ValueError(f"lowrank: {context.name} decodes to {tensor.dtype}, not floats")
        dtype = torch.promote_types(tensor.dtype, torch.float32)
        # added into the product, a fresh tensor (x + p and p + x are the same float sums)
        return self.product(tensor.shape, context, dtype, tensor.device).add_(tensor.to(dtype))
