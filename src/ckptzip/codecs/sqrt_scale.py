"""Tensor to tensor: the array over the square root of a sibling leaf as decoded (Adam's step).

Adam moves each element by ``exp_avg / sqrt(exp_avg_sq)`` (bias corrections and ``eps`` aside),
so an error in the first moment matters to training in proportion to that quotient, not to the
moment's own size. The adaptive mode stores ``exp_avg`` as ``u = m / sqrt(v^)``, ``v^`` the
``exp_avg_sq`` of the same checkpoint *as decoded* (the sibling leaf ``leaf``), and bounds the
error of ``u``: the step the resumed optimizer takes first. Pruned in this domain, a moment keeps
the elements whose *steps* are largest, where pruning ``m`` itself keeps those with the largest
gradients and drops, at every checkpoint, the elements of rarely-seen rows whose steps are as
large.

Encoding: ``x / sqrt(s)`` computed in float64 (rounded to ``x``'s precision, at least float32)
where ``s`` (the sibling) is positive, 0 where ``x`` is zero.
An element with a non-zero ``x`` over an ``s`` that is zero, negative or not finite has no such
quotient: the encoder refuses it (:func:`step_quotients` gives None, for a policy to code the
tensor another way). Decoding: ``u * sqrt(s)`` in float64, rounded once to ``dtype`` (IEEE
square root and product: the same bits on every device); a sibling that is negative or not
finite where ``u`` is non-zero is damage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from .. import _native, dtypes, hostpath
from ..errors import ConfigError
from ..hostpath import flat_array, native, native_float32
from .base import InPlaceDecoding, TransformContext, register
from .support import MAX_LEAF_INDEX


def step_quotients(tensor: torch.Tensor, scale: torch.Tensor) -> torch.Tensor | None:
    """``tensor / sqrt(scale)`` computed in float64 and rounded once to ``tensor``'s float dtype
    (at least float32), 0 where ``tensor`` is zero (``scale`` of its shape, on its device), or
    None where an element has no quotient: a non-zero element over a ``scale`` element that is
    zero, negative or not finite. In float32, not float64, for the search after it: half the
    memory and a faster sort, at an error of 2^-24 of each step."""
    if native_float32(tensor, scale):  # one native pass, the same arithmetic
        steps = hostpath.empty(tensor.shape, torch.float32)
        has_steps = _native.step_quotients(flat_array(tensor),
                                           flat_array(scale),
                                           flat_array(steps))
        return steps if has_steps else None
    usable = torch.isfinite(scale) & (scale > 0)
    if bool(((tensor != 0) & ~usable).any()):
        return None
    dtype = torch.float64 if tensor.dtype == torch.float64 else torch.float32
    out = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)

    def quotient(t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.where(t == 0, 0.0, t.double() / _sqrt(s.double().clamp_min(1e-300))).to(dtype)

    return hostpath.in_pieces(quotient, out, tensor.contiguous(), scale.contiguous())


def _sqrt(values: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root of float64 ``values`` (IEEE's): numpy's on the host,
    where torch's vectorized one can be an ulp off (1% of elements on an AVX-512 host); torch's
    on a CUDA device, whose double square root is IEEE's."""
    if values.is_cpu:
        return torch.from_numpy(np.sqrt(values.contiguous().numpy()))
    return values.sqrt()


@register
class SqrtScale(InPlaceDecoding):
    codec_id: ClassVar[str] = "sqrt-scale"

    def __init__(self, leaf: int, dtype: str) -> None:
        if type(leaf) is not int or not 0 <= leaf < MAX_LEAF_INDEX:
            raise ConfigError(f"sqrt-scale: leaf must be a leaf index (int >= 0), not {leaf!r}")
        out = dtypes.from_name(dtype)
        if out.kind != "float":
            raise ConfigError(f"sqrt-scale: dtype {dtype!r} is not a real float type")
        self.leaf = leaf
        self.dtype = out

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "leaf": self.leaf, "dtype": self.dtype.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> SqrtScale:
        return cls(config["leaf"], config["dtype"])

    @property
    def references(self) -> tuple[int, ...]:
        return (self.leaf,)

    def renumbered(self, numbers: Mapping[int, int]) -> SqrtScale:
        return SqrtScale(numbers.get(self.leaf, self.leaf), self.dtype.name)

    def sibling_problem(self, shape: tuple[int, ...],
                        siblings: dict[int, tuple[str, tuple[int, ...]]]) -> str | None:
        dtype, found = siblings[self.leaf]
        if found != shape or dtypes.from_name(dtype).kind != "float":
            return (f"its scale (leaf {self.leaf}) is {dtype} {list(found)}, not a float tensor "
                    f"of its shape {list(shape)}")
        return None

    def _scale(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        scale = (context.siblings or {}).get(self.leaf)
        if scale is None:
            raise ValueError(f"sqrt-scale: {context.name} needs its decoded scale (leaf {self.leaf})")
        if tuple(scale.shape) != tuple(tensor.shape):
            raise ValueError(f"sqrt-scale: {context.name} has shape {list(tensor.shape)}, its "
                             f"scale {list(scale.shape)}")
        return scale.to(tensor.device)

    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        quotients = step_quotients(tensor, self._scale(tensor, context))
        if quotients is None:
            raise ValueError(f"sqrt-scale: {context.name}: a non-zero element over a scale "
                             f"element that is zero, negative or not finite")
        return quotients

    def decoded(self, tensor: torch.Tensor, context: TransformContext, *,
                in_place: bool) -> torch.Tensor:
        """The moment from its steps (in place where they are contiguous float32)."""
        scale = self._scale(tensor, context)
        if (self.dtype.torch_dtype == torch.float32 and native_float32(scale) and native(tensor)
                and tensor.dtype in (torch.float32, torch.float64)):
            steps = tensor.contiguous()
            out = self.output(tensor, steps, torch.float32, in_place)
            if not _native.step_restore(flat_array(steps), steps.element_size(),
                                        flat_array(scale),
                                        flat_array(out)):
                raise ValueError(f"sqrt-scale: {context.name}'s scale is negative or not finite "
                                 f"where a value is stored")
            return out
        if bool(((tensor != 0) & ~(torch.isfinite(scale) & (scale >= 0))).any()):
            raise ValueError(f"sqrt-scale: {context.name}'s scale is negative or not finite "
                             f"where a value is stored")
        dtype = self.dtype.torch_dtype
        assert dtype is not None

        def restore(t: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
            # zero where nothing is stored, whatever the scale (0 * inf would be NaN)
            return torch.where(t == 0, 0.0, t.double() * _sqrt(s.double().clamp_min(0))).to(dtype)

        out = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)
        return hostpath.in_pieces(restore, out, tensor.contiguous(), scale.contiguous())
