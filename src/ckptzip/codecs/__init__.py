"""Codecs: typed stages with JSON configs, one file each, found through a registry."""

from .base import (
    BytesToBytes,
    Codec,
    TensorToBytes,
    TensorToTensor,
    TransformContext,
    codec_from_config,
    registered_ids,
)
from .byteplanes import BytePlanes
from .entropy import Entropy
from .residual import Residual

__all__ = [
    "BytePlanes",
    "BytesToBytes",
    "Codec",
    "Entropy",
    "Residual",
    "TensorToBytes",
    "TensorToTensor",
    "TransformContext",
    "codec_from_config",
    "registered_ids",
]
