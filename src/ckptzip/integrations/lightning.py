"""Lightning: a ``CheckpointIO`` plugin that writes Lightning's checkpoints as ``.ckz``.

::

    from lightning.pytorch.plugins.io import AsyncCheckpointIO
    from ckptzip.integrations.lightning import CkptzipCheckpointIO

    trainer = Trainer(plugins=[CkptzipCheckpointIO()])                     # or, in the background:
    trainer = Trainer(plugins=[AsyncCheckpointIO(CkptzipCheckpointIO())])
    trainer.fit(model, ckpt_path="last")

The files keep Lightning's names (``epoch=0-step=100.ckpt``) and hold the whole checkpoint: weights,
optimizer and scheduler states, loops, callbacks and hyperparameters. They are standalone, so
``ModelCheckpoint(save_top_k=...)`` may delete any of them. Read them with the plugin (the
Trainer's ``ckpt_path`` does) or :func:`ckptzip.load`, not ``torch.load``: a hyperparameter or
callback state that is not a tensor, array, number, string, bytes, None, dict, list or tuple
raises :class:`ckptzip.UnsupportedError` naming its key (``save_hyperparameters(ignore=[...])``
keeps objects such as modules out). It plugs into the ``lightning`` package
(``lightning.pytorch``).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from ..api import load, save
from ..errors import DependencyError
from . import standalone_mode

try:
    from lightning.fabric.utilities.cloud_io import get_filesystem
    from lightning.pytorch.plugins.io import CheckpointIO
except ImportError:
    raise DependencyError("ckptzip's Lightning integration needs lightning: pip install lightning") from None


class CkptzipCheckpointIO(CheckpointIO):
    """Save and load Lightning checkpoints with ckptzip. ``mode``, ``threads`` and
    ``mode_options`` go to :func:`ckptzip.save`."""

    def __init__(self, *, mode: str = "lossless", threads: int | None = None, **mode_options: Any) -> None:
        super().__init__()
        self.mode = standalone_mode(mode, "Lightning's CheckpointIO")
        self.threads = threads
        self.mode_options = mode_options
        # Under AsyncCheckpointIO a save runs in the background while ModelCheckpoint may
        # already prune its file; the file appears only when the save ends (atomic writes), so a
        # removal asked meanwhile is carried out then
        self._lock = threading.Lock()
        self._saving: dict[str, bool] = {}  # path being saved -> its removal was asked

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                f"CkptzipCheckpointIO takes no storage_options (got {storage_options!r}); "
                f"pass mode options to CkptzipCheckpointIO(...) instead"
            )
        fs = get_filesystem(path)
        fs.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
        key = os.fspath(path)
        with self._lock:
            self._saving[key] = False
        try:
            save(checkpoint, path, mode=self.mode, threads=self.threads, **self.mode_options)
        finally:
            with self._lock:
                removal_asked = self._saving.pop(key)
            if removal_asked and fs.exists(path):
                fs.rm(path, recursive=True)

    def load_checkpoint(
        self, path: str | Path, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read a checkpoint; ``weights_only`` is moot (a .ckz never runs code) and a callable
        ``map_location`` means "where it was saved", which for a .ckz is the CPU."""
        location = "cpu" if map_location is None or callable(map_location) else map_location
        state: dict[str, Any] = load(path, map_location=location, threads=self.threads)
        return state

    def remove_checkpoint(self, path: str | Path) -> None:
        with self._lock:
            if os.fspath(path) in self._saving:  # still being written: removed when it is done
                self._saving[os.fspath(path)] = True
                return
        fs = get_filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)
