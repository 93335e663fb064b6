"""Tensor to tensor, against a base: the exact residual of an array and its previous version.

Consecutive checkpoints share most of their information, so a checkpoint coded against the one
before it is far smaller. The residual is taken on bit patterns in modular integer arithmetic, so
it is bit-exact for every dtype (FIELD.md: float subtraction loses 1% of fp32 elements):

* ``xor``: ``new ^ base`` (what zipnn does);
* ``float-diff``: the difference of the patterns mapped to monotone integers, zigzagged, so that a
  change of a few ulps is a small integer whatever the sign;
* ``int-diff``: the zigzagged difference of integers.

The residual is elementwise, so it runs per chunk with the base's co-located chunk, in the native
core (``ckptzip._native.residual_encode/decode``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .. import _native
from ..errors import ConfigError
from .base import Buffer, ChunkResidual, register

KINDS: dict[str, int] = {"xor": 0, "float-diff": 1, "int-diff": 2}


@register
class Residual(ChunkResidual):
    codec_id: ClassVar[str] = "residual"

    def __init__(self, kind: str, width: int) -> None:
        if kind not in KINDS or width not in (1, 2, 4, 8):
            raise ConfigError(f"residual: kind {kind!r} / width {width} unsupported")
        self.kind = kind
        self.width = width

    def get_config(self) -> dict[str, Any]:
        return {"id": self.codec_id, "kind": self.kind, "width": self.width}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Residual:
        return cls(str(config["kind"]), config["width"])

    @property
    def native_kind(self) -> int | None:
        return KINDS[self.kind]

    def encode(self, raw: Buffer, base: Buffer) -> np.ndarray:
        # np.empty, not bytearray: every byte is written, so no zero fill first
        out = np.empty(len(memoryview(raw).cast("B")), dtype=np.uint8)
        _native.residual_encode(raw, base, out, self.width, KINDS[self.kind])
        return out

    def decode_inplace(self, data: Buffer, base: Buffer) -> None:
        _native.residual_decode(data, base, data, self.width, KINDS[self.kind])
