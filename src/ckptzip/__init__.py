"""ckptzip: small, fast, safe checkpoints for large-model training.

>>> import ckptzip
>>> report = ckptzip.save(state, "step-1000.ckz")      # doctest: +SKIP
>>> state = ckptzip.load("step-1000.ckz")              # doctest: +SKIP
"""

from ._version import __version__
from .allocator import tune_malloc
from .api import dumps, load, loads, open, save
from .errors import (
    BaseMismatchError,
    ConfigError,
    CorruptError,
    DependencyError,
    Error,
    FormatError,
    KeyNotFoundError,
    TruncatedError,
    UnsupportedError,
    VersionError,
)
from .manager import CheckpointManager
from .reader import CheckpointFile
from .writer import SaveReport

__all__ = [
    "BaseMismatchError",
    "CheckpointFile",
    "CheckpointManager",
    "ConfigError",
    "CorruptError",
    "DependencyError",
    "Error",
    "FormatError",
    "KeyNotFoundError",
    "SaveReport",
    "TruncatedError",
    "UnsupportedError",
    "VersionError",
    "__version__",
    "dumps",
    "load",
    "loads",
    "open",
    "save",
    "tune_malloc",
]
