"""Tensor to bytes, against a base: byte planes coded in buckets of the base's exponent.

For a residual against the previous checkpoint, how large an element's change is depends on the
size of the element itself: small weights move by many ulps, large ones by few. This stage splits
the residual into byte planes like :class:`BytePlanes`, then codes each plane in buckets of
elements whose *base* value has a similar exponent, each bucket with its own table. The decoder
knows the base, so the buckets cost little to describe (docs/STREAMS.md, stream format 4: the
residual's top two bytes as one symbol with its bucket's table, values from 255 up as escapes;
format 3, one rANS stream per plane, where escapes are many; streams of formats 3 and 2 from
earlier writers still decode).
It entropy-codes as well as serializes, so it ends a pipeline.
"""

from __future__ import annotations

from typing import ClassVar

from .. import _native
from ..errors import ConfigError
from .base import Buffer, ConditionedCoder, register
from .byteplanes import PlaneLayout

#: The bit rotation that puts a float's exponent in the top byte (the context of each element).
CONTEXT_ROTATE = 1


@register
class ContextPlanes(PlaneLayout, ConditionedCoder):
    """Byte planes like :class:`BytePlanes` (same parameters), entropy-coded per bucket of the
    base's exponent; it needs the base's chunk on both sides."""

    codec_id: ClassVar[str] = "ctxplanes"
    # Whole delta saves and loads of training states with every weight forced to one pipeline
    # ran at 0.83-1.21x the speed of the same residual in byteplanes+entropy (session 7,
    # docs/BENCHMARKS.md); the 2.0 this was before made the writer pass over up to 1.8 % of ratio.
    relative_cost: ClassVar[float] = 1.2

    def __init__(self, width: int, rotate: int = 0) -> None:
        if width not in (2, 4, 8):
            raise ConfigError(f"ctxplanes: width {width} unsupported (2, 4 or 8)")
        super().__init__(width, rotate)

    def native_context(self) -> tuple[int, int, int] | None:
        return self.width, self.rotate, CONTEXT_ROTATE

    def _context(self, base: Buffer) -> bytes:
        return _native.context_bytes(base, self.width, CONTEXT_ROTATE)

    def encode(self, raw: Buffer, base: Buffer) -> bytes:
        return _native.encode_planes_ctx(raw, self._context(base), self.width, self.rotate)

    def decode(self, data: Buffer, base: Buffer, out: Buffer) -> None:
        _native.decode_planes_ctx(data, self._context(base), out, self.width, self.rotate)
