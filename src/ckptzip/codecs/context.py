"""Tensor to bytes, against a base: byte planes coded in buckets of the base's exponent.

For a residual against the previous checkpoint, how large an element's change is depends on the
size of the element itself: small weights move by many ulps, large ones by few. This stage splits
the residual into byte planes like :class:`BytePlanes`, then codes each plane in buckets of
elements whose *base* value has a similar exponent, each bucket with its own table. The decoder
knows the base, so the buckets cost nothing to describe (docs/STREAMS.md, stream format 2).
It entropy-codes as well as serializes, so it ends a pipeline.
"""

from __future__ import annotations

from typing import Any, ClassVar

from .. import _native
from ..errors import ConfigError
from .base import Buffer, TensorToBytes, register

#: The bit rotation that puts a float's exponent in the top byte (the context of each element).
CONTEXT_ROTATE = 1


@register
class ContextPlanes(TensorToBytes):
    codec_id: ClassVar[str] = "ctxplanes"
    relative_cost: ClassVar[float] = 2.0  # measured 0.35-0.94x the speed of byteplanes+entropy

    def __init__(self, width: int, rotate: int = 0) -> None:
        if width not in (2, 4, 8) or not 0 <= rotate < 8 * width:
            raise ConfigError(f"ctxplanes: width {width} / rotate {rotate} unsupported")
        self.width = width
        self.rotate = rotate

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "width": self.width, "rotate": self.rotate}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ContextPlanes:
        width, rotate = config["width"], config.get("rotate", 0)
        if type(width) is not int or type(rotate) is not int:
            raise ConfigError("ctxplanes: width and rotate must be ints")
        return cls(width, rotate)

    def segments(self) -> int:
        return self.width

    def _context(self, base: Buffer) -> bytes:
        return _native.context_bytes(base, self.width, CONTEXT_ROTATE)

    def encode_with_base(self, raw: Buffer, base: Buffer) -> bytes:
        return _native.encode_planes_ctx(raw, self._context(base), self.width, self.rotate)

    def decode_with_base(self, data: Buffer, base: Buffer, out: Buffer) -> None:
        _native.decode_planes_ctx(data, self._context(base), out, self.width, self.rotate)

    def encode(self, raw: Buffer) -> Buffer:
        raise ConfigError("ctxplanes codes against a base: use encode_with_base")

    def decode(self, data: Buffer, out: Buffer) -> None:
        raise ConfigError("ctxplanes decodes against a base: use decode_with_base")
