"""Tensor to tensor: a seeded, subtractive dither of one grid step.

Rounding ``x + u * step`` to the nearest multiple of ``step`` and subtracting ``u * step`` again
on decoding, with ``u`` uniform in (-1/2, 1/2) and known to both sides, makes the error uniform
in (-step/2, step/2) and independent of ``x``: unbiased, like stochastic rounding, but with an
expected squared error of ``step**2 / 12`` per element where stochastic rounding's is
``step**2 * f * (1 - f)`` (``f`` the value's fraction of a step, 1/6 on average). The codes have
the same distribution either way, so on a dense update the dither buys a grid sqrt(2) coarser at
the same error: about half a bit per element (docs/LOSSY.md).

The reader regenerates ``u`` from the stage's ``seed`` and each element's flat index with a
counter-based hash of 32-bit integer arithmetic (FORMAT.md gives it exactly), so every device
derives the same offsets and nothing but the seed is stored.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from .. import _native, hostpath
from ..errors import ConfigError
from ..hostpath import flat_array, native, native_device
from .base import InPlaceDecoding, TransformContext, register

_MASK = 0xFFFFFFFF
#: Elements hashed per block (bounds the int64 temporaries at a few hundred MB).
_BLOCK = 1 << 24


def _mul32_(x: torch.Tensor, multiplier: int) -> torch.Tensor:
    """``x * multiplier mod 2**32`` for ``0 <= x < 2**32``, in place, in int64 arithmetic that
    never overflows: the low and high 16 bits of ``x`` are multiplied apart (each product
    < 2**49). In place, so that a device holds one temporary beside ``x``, not five."""
    high = x >> 16
    x &= 0xFFFF
    x *= multiplier
    high *= multiplier & 0xFFFF
    high <<= 16
    x += high
    x &= _MASK
    return x


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (the "lowbias32" xorshift-multiply constants) on int64 values in
    ``[0, 2**32)``; bijective, so distinct indices get distinct outputs. ``x`` is left as it is
    (the first step makes the tensor the others work on in place)."""
    x = x ^ (x >> 16)
    _mul32_(x, 0x7FEB352D)
    x ^= x >> 15
    _mul32_(x, 0x846CA68B)
    x ^= x >> 16
    return x


def _key(seed: int, high: int, device: torch.device) -> torch.Tensor:
    """The per-block key: the seed mixed with the high 32 bits of the element index."""
    word = torch.tensor([high & _MASK], dtype=torch.int64, device=device)
    return hash32(hash32(word) ^ seed)


def offsets(count: int, seed: int, device: torch.device | str = "cpu", first: int = 0) -> torch.Tensor:
    """The dither of elements ``first .. first + count - 1`` in units of a step: float64 values
    ``(h >> 8) / 2**24 + 2**-25 - 1/2`` in (-1/2, 1/2), where ``h`` is
    ``hash32(i_low ^ hash32(hash32(i_high) ^ seed))`` of the index's low and high 32 bits.
    Exact in float32 and float64 alike (25 significant bits). On the host the native core
    computes them (GIL released); on other devices torch's int64 ops do, to the same values."""
    device = torch.device(device)
    if native_device(device):
        out = hostpath.empty((count,), torch.float64)
        if count:
            _native.dither_offsets(out.numpy(), first, seed)
        return out
    out = torch.empty(count, dtype=torch.float64, device=device)
    start, end = first, first + count
    while start < end:
        # blocks of at most _BLOCK elements that share the high 32 bits of their indices
        stop = min(start + _BLOCK, end, ((start >> 32) + 1) << 32)
        out[start - first:stop - first] = offsets_by_torch(start, stop, seed, device)
        start = stop
    return out


def offsets_by_torch(start: int, stop: int, seed: int, device: torch.device) -> torch.Tensor:
    """:func:`offsets` of the indices ``start .. stop - 1`` (which share their high 32 bits) in
    torch's int64 ops, on any device."""
    index = torch.arange(start, stop, dtype=torch.int64, device=device)
    index &= _MASK
    index ^= _key(seed, start >> 32, device)
    hashed = hash32(index)
    del index
    hashed >>= 8
    out = hashed.double()
    del hashed
    out *= 2.0**-24
    out += 2.0**-25 - 0.5
    return out


@register
class Dither(InPlaceDecoding):
    codec_id: ClassVar[str] = "dither"

    def __init__(self, seed: int, step: float) -> None:
        check_seed_and_step(self.codec_id, seed, step)
        self.seed = seed
        self.step = float(step)

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "seed": self.seed, "step": self.step}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Dither:
        return cls(config["seed"], config["step"])

    def shift(self, shape: torch.Size | tuple[int, ...], device: torch.device,
              first: int = 0) -> torch.Tensor:
        """``u * step`` for each element of a tensor of ``shape`` (float64); ``first``: the
        index of its first element in the whole tensor, for a piece of it."""
        return scaled_offsets(shape, self.seed, self.step, device, first)

    # Both directions compute in float64, where u * step is exact, and return float32 (float64
    # for float64 input), so the writer's reconstruction is the reader's to the bit.
    # On the host the native core does it in one pass, with the same float64 arithmetic.
    def encode(self, tensor: torch.Tensor, context: TransformContext) -> torch.Tensor:
        return self._shifted(tensor, 1)

    def decoded(self, tensor: torch.Tensor, context: TransformContext, *,
                in_place: bool) -> torch.Tensor:
        if not tensor.is_floating_point():
            raise ValueError(f"dither: {context.name} decodes to {tensor.dtype}, not floats")
        return self._shifted(tensor, -1, in_place)

    def _shifted(self, tensor: torch.Tensor, sign: int, in_place: bool = False) -> torch.Tensor:
        """``tensor`` shifted; ``in_place``: into its own memory where that holds the result
        (on the host, float32 or float64 and contiguous)."""
        dtype = torch.promote_types(tensor.dtype, torch.float32)
        if not native(tensor):
            # in pieces of hostpath.TORCH_PIECE elements: the float64 temporaries stay small
            flat = tensor.reshape(-1)
            shifted = torch.empty(flat.shape, dtype=dtype, device=flat.device)
            for start in range(0, flat.numel(), hostpath.TORCH_PIECE):
                part = flat[start:start + hostpath.TORCH_PIECE]
                # the piece plus or minus its shift, in float64 and in place in the shift (the
                # same sum as part.double() + sign * shift: negation is exact, addition commutes)
                shift = self.shift(part.shape, part.device, start)
                if sign < 0:
                    shift.neg_()
                shift += part
                shifted[start:start + part.numel()] = shift  # rounded to dtype as .to() does
            return shifted.reshape(tensor.shape)
        values = tensor.to(dtype).contiguous()
        out = self.output(tensor, values, values.dtype, in_place)
        if values.numel():
            _native.dither_shift(flat_array(values), flat_array(out),
                                 values.element_size(), self.seed, self.step, sign)
        return out


def scaled_offsets(shape: torch.Size | tuple[int, ...], seed: int, step: float,
                   device: torch.device, first: int = 0) -> torch.Tensor:
    """:func:`offsets` of ``seed`` (from element ``first`` on) times ``step``, as a float64
    tensor of ``shape``."""
    scaled = offsets(math.prod(shape), seed, device, first)  # a fresh tensor: scaled in place
    scaled *= step
    return scaled.reshape(shape)


def finite_number(value: Any) -> bool:
    """Whether a config value is a finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_seed_and_step(codec: str, seed: Any, step: Any) -> None:
    """ConfigError unless ``seed`` is an int in [0, 2**32) and ``step`` a finite number > 0."""
    if type(seed) is not int or not 0 <= seed <= _MASK:
        raise ConfigError(f"{codec}: seed must be an int in [0, 2**32), not {seed!r}")
    if not (finite_number(step) and step > 0):
        raise ConfigError(f"{codec}: step must be a finite number > 0, not {step!r}")
