"""Tensor to bytes: byte planes (byte-grouping) with an optional bit rotation.

Byte ``p`` of every element goes to plane ``p``, so each plane holds bytes of one kind: the
exponent plane is highly skewed and compresses well, the low mantissa planes are near-random. For
IEEE-style floats each element is first rotated left by one bit: the sign drops into the lowest
(noise) byte and the 8 exponent bits of bf16/fp32 fill one whole byte (FIELD.md).
"""

from __future__ import annotations

from typing import Any, TypeVar

from .. import _native
from ..errors import ConfigError
from .base import Buffer, Codec, TensorToBytes, register

_WIDTHS = (1, 2, 4, 8, 16)

L = TypeVar("L", bound="PlaneLayout")


class PlaneLayout(Codec):
    """The parameters of a byte-plane split, shared by the stages that make one
    (:class:`BytePlanes`, :class:`~ckptzip.codecs.ContextPlanes`): bytes per element and the
    left bit rotation applied to each element first."""

    def __init__(self, width: int, rotate: int = 0) -> None:
        if width not in _WIDTHS or not 0 <= rotate < 8 * width:
            raise ConfigError(f"byteplanes: width {width} / rotate {rotate} out of range")
        self.width = width
        self.rotate = rotate

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "width": self.width, "rotate": self.rotate}

    @classmethod
    def from_config(cls: type[L], config: dict[str, Any]) -> L:
        width, rotate = config["width"], config.get("rotate", 0)
        if type(width) is not int or type(rotate) is not int:
            raise ConfigError("byteplanes: width and rotate must be ints")
        return cls(width, rotate)


@register
class BytePlanes(PlaneLayout, TensorToBytes):
    codec_id = "byteplanes"

    def native_planes(self) -> tuple[int, int] | None:
        return self.width, self.rotate

    def segments(self) -> int:
        return self.width

    def encode(self, raw: Buffer) -> Buffer:
        out = bytearray(len(memoryview(raw)))
        _native.split_planes(raw, out, self.width, self.rotate)
        return out

    def decode(self, data: Buffer, out: Buffer) -> None:
        _native.merge_planes(data, out, self.width, self.rotate)
