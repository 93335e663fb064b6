"""DeepSpeed: a ``CheckpointEngine`` that writes ``engine.save_checkpoint``'s files as ckptzip
containers (the names, ``mp_rank_00_model_states.pt`` and so on, stay DeepSpeed's).

::

    from ckptzip.integrations.deepspeed import attach

    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=config, ...)
    attach(engine)
    engine.save_checkpoint("ckpt")
    engine.load_checkpoint("ckpt")

DeepSpeed's states hold only tensors, numbers, strings and containers for ZeRO stage 0 with a
torch optimizer; where a state holds another object (a loss-scaler object under fp16, a set),
saving raises :class:`ckptzip.UnsupportedError` naming its key.
"""

from __future__ import annotations

from typing import Any

from ..api import load, save
from ..errors import DependencyError

try:
    from deepspeed.runtime.checkpoint_engine.checkpoint_engine import CheckpointEngine
except ImportError:
    raise DependencyError(
        "ckptzip's DeepSpeed integration needs deepspeed: DS_BUILD_OPS=0 pip install deepspeed"
    ) from None


class CkptzipCheckpointEngine(CheckpointEngine):
    """DeepSpeed's checkpoint engine interface over :func:`ckptzip.save`/:func:`ckptzip.load`.
    Each file is written atomically, so ``commit`` has nothing left to do."""

    def __init__(
        self, config_params: Any = None, *, mode: str = "lossless", threads: int | None = None,
        **mode_options: Any,
    ) -> None:
        super().__init__(config_params)
        self.name = "CkptzipCheckpointEngine"
        self.mode = mode
        self.threads = threads
        self.mode_options = mode_options

    def create(self, info: Any) -> None:
        """Nothing to prepare: files appear complete or not at all."""

    def save(self, state_dict: Any, path: str) -> None:
        save(state_dict, path, mode=self.mode, threads=self.threads, **self.mode_options)

    def load(self, path: str, map_location: Any = None) -> Any:
        """Read a file; a callable ``map_location`` (DeepSpeed passes ``lambda s, loc: s``) means
        "where it was saved", which for a .ckz is the CPU."""
        location = "cpu" if map_location is None or callable(map_location) else map_location
        return load(path, map_location=location, threads=self.threads)

    def commit(self, info: Any) -> bool:
        return True


def attach(engine: Any, **options: Any) -> CkptzipCheckpointEngine:
    """Make a ``DeepSpeedEngine`` save and load its checkpoints with ckptzip."""
    checkpoint_engine = CkptzipCheckpointEngine(**options)
    engine.checkpoint_engine = checkpoint_engine
    return checkpoint_engine
