"""Lightning: a ``CheckpointIO`` plugin that writes Lightning's checkpoints as ``.ckz``.

::

    from lightning.pytorch.plugins.io import AsyncCheckpointIO
    from ckptzip.integrations.lightning import CkptzipCheckpointIO

    trainer = Trainer(plugins=[CkptzipCheckpointIO()])                     # or, in the background:
    trainer = Trainer(plugins=[AsyncCheckpointIO(CkptzipCheckpointIO())])
    trainer.fit(model, ckpt_path="last")

The files keep Lightning's names (``epoch=0-step=100.ckpt``) and hold the whole checkpoint: weights,
optimizer and scheduler states, loops, callbacks and hyperparameters. They are standalone, so
``ModelCheckpoint(save_top_k=...)`` may delete any of them.

For deltas, lossy ones too, the callback :class:`CkptzipCheckpoint` takes ``ModelCheckpoint``'s
place: it saves the same checkpoint into a :class:`ckptzip.CheckpointManager` directory
(``step-00000100.ckz``, each a delta against the one before, in the background), which the plugin
reads back::

    trainer = Trainer(callbacks=[CkptzipCheckpoint("ckpt", every_n_train_steps=100,
                                                   mode="adaptive", keep_last=3)],
                      plugins=[CkptzipCheckpointIO()])
    trainer.fit(model, ckpt_path=CkptzipCheckpoint.latest("ckpt"))   # None: from the start
 Read them with the plugin (the
Trainer's ``ckpt_path`` does) or :func:`ckptzip.load`, not ``torch.load``: a hyperparameter or
callback state that is not a tensor, array, number, string, bytes, None, dict, list or tuple
raises :class:`ckptzip.UnsupportedError` naming its key (``save_hyperparameters(ignore=[...])``
keeps objects such as modules out). It plugs into the ``lightning`` package
(``lightning.pytorch``).
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from ..api import load, save
from ..chain import same_file
from ..errors import ConfigError, DependencyError
from ..manager import CheckpointManager, step_of
from ..objstore import StorageOptions
from ..storage import is_url, local_path
from . import check_mode, standalone_mode

try:
    from lightning.fabric.utilities.cloud_io import get_filesystem
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.plugins.io import CheckpointIO
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
except ImportError:
    raise DependencyError("ckptzip's Lightning integration needs lightning: pip install lightning") from None


log = logging.getLogger("ckptzip")


class CkptzipCheckpointIO(CheckpointIO):
    """Save and load Lightning checkpoints with ckptzip. ``mode``, ``threads`` and
    ``mode_options`` go to :func:`ckptzip.save`; ``storage_options`` to the fsspec filesystem of
    a URL path (``s3://...``) on every save, load and removal: give it the ``storage_options``
    of a :class:`CkptzipCheckpoint` on a bucket prefix, whose step files this plugin reads."""

    def __init__(self, *, mode: str = "lossless", threads: int | None = None,
                 storage_options: StorageOptions = None, **mode_options: Any) -> None:
        super().__init__()
        self.mode = standalone_mode(mode, "Lightning's CheckpointIO")
        check_mode(mode, mode_options)  # not at the first checkpoint
        self.threads = threads
        self.storage_options = storage_options
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
                f"CkptzipCheckpointIO's save_checkpoint takes no storage_options (got "
                f"{storage_options!r}); pass them, and mode options, to CkptzipCheckpointIO(...)"
            )
        fs = self._filesystem(path)
        fs.makedirs(os.path.dirname(os.fspath(path)), exist_ok=True)
        key = os.fspath(path)
        with self._lock:
            self._saving[key] = False
        try:
            save(checkpoint, path, mode=self.mode, threads=self.threads,
                 storage_options=self.storage_options, **self.mode_options)
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
        state: dict[str, Any] = load(path, map_location=location, threads=self.threads,
                                     storage_options=self.storage_options)
        return state

    def remove_checkpoint(self, path: str | Path) -> None:
        with self._lock:
            if os.fspath(path) in self._saving:  # still being written: removed when it is done
                self._saving[os.fspath(path)] = True
                return
        fs = self._filesystem(path)
        if fs.exists(path):
            fs.rm(path, recursive=True)

    def _filesystem(self, path: str | Path) -> Any:
        return get_filesystem(path, **(self.storage_options or {}))


class CkptzipCheckpoint(Callback):
    """Checkpoint a Lightning run every ``every_n_train_steps`` optimizer steps into a
    :class:`ckptzip.CheckpointManager` at ``dirpath``: deltas against the previous checkpoint
    (a keyframe every ``keyframe_every``), in ``mode`` (default ``"adaptive"``; ``"lossless"``
    for bit-exact deltas), in the background, ``keep_last`` of them kept with their chains.
    Other keyword arguments go to the manager (``guard``, ``threads``, ``storage_options``, a
    mode's options, ...). Each file holds what Lightning's own checkpoint holds (``trainer
    .save_checkpoint``'s dict), so ``trainer.fit(..., ckpt_path=<a step file>)`` resumes from it
    through :class:`CkptzipCheckpointIO`; the first delta after such a resume is saved as
    trained from its base as decoded (``resumed``, docs/LOSSY.md). Rank 0 writes; strategies
    that shard the state (FSDP, DeepSpeed) are refused: use DCP with
    :class:`ckptzip.dcp.CompressedWriter` there."""

    def __init__(self, dirpath: str | os.PathLike[str], *, every_n_train_steps: int,
                 mode: str = "adaptive", keyframe_every: int | None = 8,
                 keep_last: int | None = None, **manager_options: Any) -> None:
        super().__init__()
        if type(every_n_train_steps) is not int or every_n_train_steps < 1:
            raise ConfigError(f"every_n_train_steps must be a positive int, not "
                              f"{every_n_train_steps!r}")
        self.dirpath = os.fspath(dirpath)
        self.every_n_train_steps = every_n_train_steps
        self.options: dict[str, Any] = {"mode": mode, "keyframe_every": keyframe_every,
                                        "keep_last": keep_last, **manager_options}
        self.manager: CheckpointManager | None = None
        self._last_step: int | None = None  # the step saved last: one save a step
        self._resumed_from: str | None = None  # the step file this fit resumed from, until a save

    @staticmethod
    def latest(dirpath: str | os.PathLike[str], **manager_options: Any) -> str | None:
        """The newest restorable step file in ``dirpath`` (None where there is none yet), for
        ``trainer.fit(ckpt_path=...)``; a bucket prefix (``s3://bucket/run``, with the
        ``storage_options`` the callback was given) gives a URL, which the plugin reads given the
        same ``storage_options``. It opens the directory as a manager for the moment (its lock
        or lease; unfinished files or uploads a crash left are cleaned up): call it before the
        fit, not while another trainer writes there."""
        location = os.fspath(dirpath)
        if not is_url(location) and not os.path.isdir(local_path(location)):
            return None  # nothing saved yet: not created here
        with CheckpointManager(dirpath, **manager_options) as manager:
            step = manager.latest_step()
            return None if step is None else manager.path(step)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit":
            return
        if not isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy)):
            raise ConfigError(
                f"CkptzipCheckpoint saves the whole state from rank 0, and "
                f"{type(trainer.strategy).__name__} shards it across ranks: checkpoint it with "
                f"torch.distributed.checkpoint and ckptzip.dcp.CompressedWriter (docs/DCP.md)")
        if trainer.is_global_zero and self.manager is None:
            self.manager = CheckpointManager(self.dirpath, **self.options)
            others = [type(c).__name__ for c in getattr(trainer, "checkpoint_callbacks", [])]
            if others:  # Lightning adds one unless told not to
                log.info("%s: Lightning's %s saves checkpoints too, standalone, beside this "
                         "callback's deltas; Trainer(enable_checkpointing=False) leaves this one "
                         "alone", self.dirpath, ", ".join(others))

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # one of this callback's step files (a path, or a URL on a bucket prefix)?
        path = None if trainer.ckpt_path is None else os.fspath(trainer.ckpt_path)
        inside = (path is not None and step_of(os.path.basename(path)) is not None
                  and same_file(os.path.dirname(path), self.dirpath))
        self._resumed_from = path if inside else None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == 0 or step % self.every_n_train_steps or step == self._last_step:
            return
        self._last_step = step
        checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        if self.manager is None:  # not rank 0
            return
        resumed = None
        if self._resumed_from is not None:
            # trained from that checkpoint as decoded: say so where this delta is coded against it
            earlier = [s for s in self.manager.steps() if s < step]
            resumed = bool(earlier) and same_file(self.manager.path(earlier[-1]),
                                                  self._resumed_from)
            self._resumed_from = None
        self.manager.save(step, checkpoint, resumed=resumed)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.manager is not None:
            self.manager.wait()  # a failed background save is raised here, not lost

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.manager is not None:
            manager, self.manager = self.manager, None
            manager.close()
