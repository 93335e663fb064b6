"""Bytes to bytes: ckptzip's own entropy coder (C, ``ckptzip._native``).

Each segment (byte plane) of a chunk gets its own frequency table: local statistics beat global
ones. A segment that does not shrink is stored raw, one made of a single repeated byte costs one
byte. The stream is self-describing; its layout is in docs/FORMAT.md ("Entropy streams").
"""

from __future__ import annotations

from .. import _native
from ..errors import CorruptError
from .base import Buffer, BytesToBytes, register


@register
class Entropy(BytesToBytes):
    codec_id = "entropy"
    native_entropy = True

    def encode(self, data: Buffer, segments: int) -> bytes:
        return _native.encode(data, segments)

    def decoded_size(self, data: Buffer) -> int:
        try:
            return _native.decoded_size(data)
        except ValueError as exc:
            raise CorruptError(str(exc)) from None

    def decode(self, data: Buffer, out: Buffer) -> None:
        try:
            _native.decode(data, out)
        except ValueError as exc:
            raise CorruptError(str(exc)) from None
