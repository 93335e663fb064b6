"""Codecs: typed stages with JSON configs, one file each, found through a registry."""

from .base import (
    BytesToBytes,
    ChunkResidual,
    Codec,
    ConditionedCoder,
    InPlaceDecoding,
    TensorToBytes,
    TensorToTensor,
    TransformContext,
    codec_from_config,
    registered_ids,
    undo,
)
from .base_partition import BasePartition
from .base_ratio import BaseRatio, FilledBaseRatio
from .byteplanes import BytePlanes
from .context import ContextPlanes
from .dither import Dither
from .entropy import Entropy
from .kmeans import KMeans
from .lossy_residual import LossyResidual
from .lowrank import LowRank
from .mark import Mark
from .residual import Residual
from .sparse import Sparse
from .sqrt_scale import SqrtScale
from .support import Support
from .zeros import ExactZeros

__all__ = [
    "BasePartition",
    "BaseRatio",
    "BytePlanes",
    "BytesToBytes",
    "ChunkResidual",
    "Codec",
    "ConditionedCoder",
    "ContextPlanes",
    "Dither",
    "Entropy",
    "ExactZeros",
    "FilledBaseRatio",
    "InPlaceDecoding",
    "KMeans",
    "LossyResidual",
    "LowRank",
    "Mark",
    "Residual",
    "Sparse",
    "SqrtScale",
    "Support",
    "TensorToBytes",
    "TensorToTensor",
    "TransformContext",
    "codec_from_config",
    "registered_ids",
    "undo",
]
