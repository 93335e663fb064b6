"""Hugging Face transformers: Trainer checkpoints whose model, optimizer, scheduler and RNG files
are ``.ckz``, and that resume with ``trainer.train(resume_from_checkpoint=...)``.

::

    from ckptzip.integrations.hf import CkptzipTrainer

    trainer = CkptzipTrainer(model=model, args=TrainingArguments(..., save_total_limit=2), ...)
    trainer.train()
    trainer.train(resume_from_checkpoint=True)

``CkptzipTrainerMixin`` does the same for a Trainer subclass of your own
(``class MyTrainer(CkptzipTrainerMixin, Seq2SeqTrainer)``). In ``checkpoint-N/``, ``model.ckz``,
``optimizer.ckz``, ``scheduler.ckz`` and ``rng_state.ckz`` take the place of
``model.safetensors``, ``optimizer.pt``, ``scheduler.pt`` and ``rng_state.pth``; the config,
tokenizer and ``trainer_state.json`` stay as they are. By default (lossless) every checkpoint is
standalone, so the Trainer's rotation by ``save_total_limit`` may delete any of them.

With deltas (``ckptzip_keyframe_every`` other than 1; a lossy ``ckptzip_mode`` needs them and
makes them the default, a keyframe every 8) the weights and the optimizer state go together into
``state.ckz``, coded against the previous checkpoint's, and the rotation keeps every checkpoint
a kept one's chain needs (the newest and the best as the Trainer keeps them, then at most
``save_total_limit``, beyond which only bases stay). ``trainer.save_model()``
outside checkpoints still writes plain safetensors for ``from_pretrained``. Under DeepSpeed the
engine's files (``global_stepN/``: its model and ZeRO optimizer states) go through ckptzip's
DeepSpeed checkpoint engine (:mod:`ckptzip.integrations.deepspeed`), attached once the Trainer has
built the engine, before it resumes; the Trainer's other files there stay as it writes them. Under
FSDP, XLA or SageMaker the Trainer's own files are written unchanged.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from typing import Any

import torch

from ..api import load, save
from ..api import open as open_checkpoint
from ..chain import resolve_relative, walk_chain
from ..errors import ConfigError, Error
from ..held import (
    HeldCheckpoint,
    PendingHold,
    hold_loaded,
    hold_written_soon,
    open_held_base,
    settle,
    worth_holding,
)
from ..tree import flatten
from . import check_mode, require, standalone_mode

MODEL_FILE = "model.ckz"
OPTIMIZER_FILE = "optimizer.ckz"
SCHEDULER_FILE = "scheduler.ckz"
#: With deltas: the weights and the optimizer state in one file (a lossy mode codes each weight
#: with its Adam moments), coded against the previous checkpoint's.
STATE_FILE = "state.ckz"
#: The keyframe interval of a lossy mode's deltas when none is given (CheckpointManager's).
LOSSY_KEYFRAME_EVERY = 8
CHECKPOINT_FOLDER = re.compile(r"checkpoint-(\d+)")

log = logging.getLogger("ckptzip")

#: The mixin's static base: the Trainer's attributes are dynamic to the type checker (they are
#: there at run time, through the real Trainer class after the mixin in the MRO).
_TrainerBase: Any = object


class CkptzipTrainerMixin(_TrainerBase):
    """Mix in before a ``transformers.Trainer`` class to compress its checkpoints.

    Extra keyword arguments: ``ckptzip_mode`` (default ``"lossless"``), ``ckptzip_threads`` and
    ``ckptzip_options`` (a dict of the mode's options), passed to :func:`ckptzip.save`;
    ``ckptzip_keyframe_every``: ``"auto"`` (the default: 1, standalone files, for lossless; 8 for
    a lossy mode), 1 (standalone), K > 1 (deltas, a keyframe every K checkpoints) or None
    (deltas only after the first); ``ckptzip_cache_decoded``: with deltas, hold the newest
    ``state.ckz`` as decoded in host memory so the next one needs no decode of its chain
    (:class:`ckptzip.CheckpointManager`'s ``cache_decoded``: None, the default, while the state
    is at most a quarter of the memory available).
    """

    def __init__(
        self,
        *args: Any,
        ckptzip_mode: str = "lossless",
        ckptzip_threads: int | None = None,
        ckptzip_options: dict[str, Any] | None = None,
        ckptzip_keyframe_every: int | str | None = "auto",
        ckptzip_cache_decoded: bool | None = None,
        **kwargs: Any,
    ) -> None:
        if ckptzip_keyframe_every == "auto":
            ckptzip_keyframe_every = 1 if ckptzip_mode == "lossless" else LOSSY_KEYFRAME_EVERY
        if ckptzip_keyframe_every is not None and (
                type(ckptzip_keyframe_every) is not int or ckptzip_keyframe_every < 1):
            raise ConfigError(f"ckptzip_keyframe_every must be 'auto', a positive int or None, not "
                              f"{ckptzip_keyframe_every!r}")
        check_mode(ckptzip_mode, dict(ckptzip_options or {}))  # not at the first checkpoint
        if ckptzip_keyframe_every == 1:
            standalone_mode(ckptzip_mode, "Hugging Face's Trainer with ckptzip_keyframe_every=1")
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        strategy = getattr(training_args, "hub_strategy", None)
        if (ckptzip_keyframe_every != 1 and getattr(training_args, "push_to_hub", False)
                and str(getattr(strategy, "value", strategy)) == "checkpoint"):  # before any upload
            raise ConfigError(
                "hub_strategy='checkpoint' uploads the newest checkpoint folder alone (as "
                "last-checkpoint), and with ckptzip's deltas its state.ckz needs the folders before "
                "it: use hub_strategy='all_checkpoints', or ckptzip_keyframe_every=1 (lossless, "
                "standalone checkpoints)")
        if ckptzip_cache_decoded is not None and not isinstance(ckptzip_cache_decoded, bool):
            raise ConfigError(f"ckptzip_cache_decoded must be True, False or None, not "
                              f"{ckptzip_cache_decoded!r}")
        self.ckptzip_cache_decoded = ckptzip_cache_decoded
        self.ckptzip_mode = ckptzip_mode
        self.ckptzip_keyframe_every: int | None = ckptzip_keyframe_every
        super().__init__(*args, **kwargs)
        if not self._ckptzip_applies():  # DeepSpeed's engine or the Trainer writes the files
            standalone_mode(ckptzip_mode, "Hugging Face's Trainer under DeepSpeed, FSDP, XLA or "
                            "SageMaker (the engine or the Trainer writes each file on its own)")

        self.ckptzip_threads = ckptzip_threads
        self.ckptzip_options = dict(ckptzip_options or {})
        self._ckptzip_in_checkpoint = False
        self._ckptzip_weights: dict[str, Any] | None = None  # held for state.ckz
        self._ckptzip_resumed_from: str | None = None  # the checkpoint folder training resumed from
        self._ckptzip_loaded: tuple[str, Any] | None = None  # a decoded state.ckz, until both parts are read
        # the newest state.ckz as decoded (its lossy tensors decoding in the background)
        self._ckptzip_held: HeldCheckpoint | PendingHold | None = None

    @property
    def _ckptzip_deltas(self) -> bool:
        return self.ckptzip_keyframe_every != 1

    def _ckptzip_applies(self) -> bool:
        """True on the single-process and DDP paths, where the Trainer writes plain torch files."""
        utils = require("transformers.utils", "transformers")
        return not (
            self.is_deepspeed_enabled or self.is_fsdp_enabled
            or utils.is_sagemaker_mp_enabled() or utils.is_torch_xla_available()
        )

    def _ckptzip_save(self, state: Any, path: str) -> None:
        """A standalone file: lossless where deltas carry the lossy mode (the scheduler, RNG)."""
        mode = "lossless" if self._ckptzip_deltas else self.ckptzip_mode
        options = {} if self._ckptzip_deltas else self.ckptzip_options
        save(state, path, mode=mode, threads=self.ckptzip_threads, **options)

    def _ckptzip_save_state(self, output_dir: str, optimizer: dict[str, Any] | None) -> None:
        """``state.ckz``: the held weights (and the optimizer's state), against the newest earlier
        checkpoint's ``state.ckz`` whose chain is whole; marked resumed where training went on
        from that one as decoded."""
        assert self._ckptzip_weights is not None
        state: dict[str, Any] = {"model": self._ckptzip_weights}
        if optimizer is not None:
            state["optimizer"] = optimizer
        self._ckptzip_weights = None
        _drop_dependents(output_dir)
        base = _previous_state(output_dir)
        resumed = base is not None and self._ckptzip_resumed_from is not None and (
            os.path.abspath(os.path.dirname(base)) == os.path.abspath(self._ckptzip_resumed_from))
        held, self._ckptzip_held = settle(self._ckptzip_held), None  # consumed: a failure holds nothing
        opened = None
        if held is not None and base is not None and os.path.abspath(base) == held.location:
            opened = open_held_base(base, held, threads=self.ckptzip_threads)
        path = os.path.abspath(os.path.join(output_dir, STATE_FILE))
        save(state, path, mode=self.ckptzip_mode, base=base if opened is None else opened,
             keyframe_every=self.ckptzip_keyframe_every, resumed=resumed,
             threads=self.ckptzip_threads, **self.ckptzip_options)
        self._ckptzip_resumed_from = None  # later checkpoints descend from the true state
        leaves = flatten(state)[1]
        if worth_holding(sum(leaf.nbytes for leaf in leaves), self.ckptzip_cache_decoded,
                         self.args.output_dir):
            # training goes on while the lossy tensors decode; the next save waits for them
            self._ckptzip_held = hold_written_soon(path, {leaf.name: leaf for leaf in leaves},
                                                   held, threads=self.ckptzip_threads)

    def _rng_file(self) -> str:
        world = self.args.world_size
        return "rng_state" if world <= 1 else f"rng_state_{self.args.process_index}"

    def _ckptzip_attach_deepspeed(self) -> None:
        """Under DeepSpeed, make the engine's checkpoint engine ckptzip's, once the engine exists
        (accelerate's wrapper holds it); nothing elsewhere or before."""
        wrapped = getattr(self.accelerator, "deepspeed_engine_wrapped", None)
        if not self.is_deepspeed_enabled or wrapped is None:
            return
        from .deepspeed import CkptzipCheckpointEngine, attach

        if not isinstance(wrapped.engine.checkpoint_engine, CkptzipCheckpointEngine):
            attach(wrapped.engine, mode=self.ckptzip_mode, threads=self.ckptzip_threads,
                   **self.ckptzip_options)

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        """The Trainer's own, then under DeepSpeed the attach: the Trainer builds the scheduler
        after ``accelerator.prepare`` made the engine and before it loads a checkpoint."""
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        self._ckptzip_attach_deepspeed()
        return scheduler

    # -- saving ---------------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        self._ckptzip_attach_deepspeed()  # should a Trainer version build the scheduler otherwise
        self._ckptzip_in_checkpoint = self._ckptzip_applies()
        deltas = self._ckptzip_in_checkpoint and self._ckptzip_deltas
        limit = self.args.save_total_limit
        if deltas:  # the Trainer's rotation knows no chains: this one runs after the save
            self.args.save_total_limit = None
        try:
            super()._save_checkpoint(model, trial)
            folder = self._ckptzip_checkpoint_folder(trial)
            if deltas and self._ckptzip_weights is not None and self.args.should_save:
                self._ckptzip_save_state(folder, None)  # save_only_model: no optimizer state
            if deltas and self.args.should_save:
                self._ckptzip_rotate(os.path.dirname(folder), limit)
        finally:
            self._ckptzip_in_checkpoint = False
            self._ckptzip_weights = None
            self.args.save_total_limit = limit

    def _finalize_training(self, trial: Any, *args: Any, **kwargs: Any) -> Any:
        """The Trainer's, except with deltas its last clean-up (under ``save_total_limit=1``
        every checkpoint but the best is deleted) keeps the best one's chain too."""
        limit = self.args.save_total_limit
        deltas = self._ckptzip_deltas and self._ckptzip_applies() and limit == 1
        if deltas:
            self.args.save_total_limit = None
        try:
            result = super()._finalize_training(trial, *args, **kwargs)
        finally:
            self.args.save_total_limit = limit
        best = self.state.best_model_checkpoint
        if deltas and best is not None and self.args.should_save:
            others = [folder for folder in _checkpoints(self._get_output_dir(trial=trial))
                      if os.path.abspath(folder) != os.path.abspath(best)]
            _delete_unneeded(others, kept=[best])
        return result

    def _ckptzip_checkpoint_folder(self, trial: Any) -> str:
        return os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")

    def _ckptzip_rotate(self, run_dir: str, limit: int | None) -> None:
        """The Trainer's rotation (``save_total_limit``; the newest and the best checkpoints
        kept), except that a checkpoint whose ``state.ckz`` a kept one's chain needs stays."""
        if limit is None or limit <= 0:
            return
        utils = require("transformers.trainer_utils", "transformers")
        best = self.state.best_model_checkpoint
        folders = utils.sort_checkpoints(run_dir, best_model_checkpoint=best)  # oldest first
        protected = {os.path.abspath(folders[-1])} if folders else set()
        if best is not None:
            protected.add(os.path.abspath(best))
        keep = max(limit, len(protected))
        doomed, kept = [], list(folders)
        for folder in folders:
            if len(kept) <= keep:
                break
            if os.path.abspath(folder) not in protected:
                doomed.append(folder)
                kept.remove(folder)
        _delete_unneeded(doomed, kept)

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        super()._save(output_dir, state_dict)
        directory = output_dir if output_dir is not None else self.args.output_dir
        weights = os.path.join(directory, "model.safetensors")
        if self._ckptzip_in_checkpoint and self._ckptzip_deltas:
            # held for state.ckz, with the optimizer's state: the model's own state dict, whose
            # order is the optimizer's (a lossy mode pairs each weight with its moments by it)
            self._ckptzip_weights = self.accelerator.unwrap_model(self.model).state_dict()
            if self.args.should_save and os.path.isfile(weights):
                os.remove(weights)
        elif self._ckptzip_in_checkpoint and self.args.should_save and os.path.isfile(weights):
            from safetensors.torch import load_file

            self._ckptzip_save(load_file(weights), os.path.join(directory, MODEL_FILE))
            os.remove(weights)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self._ckptzip_in_checkpoint:
            super()._save_optimizer_and_scheduler(output_dir)
        elif self.args.should_save:
            if self._ckptzip_deltas:
                self._ckptzip_save_state(output_dir, self.optimizer.state_dict())
            else:
                self._ckptzip_save(self.optimizer.state_dict(), os.path.join(output_dir, OPTIMIZER_FILE))
            self._ckptzip_save(self.lr_scheduler.state_dict(), os.path.join(output_dir, SCHEDULER_FILE))

    def _save_rng_state(self, output_dir: str) -> None:
        super()._save_rng_state(output_dir)
        written = os.path.join(output_dir, self._rng_file() + ".pth")
        if self._ckptzip_in_checkpoint and os.path.isfile(written):
            with require("transformers.trainer_pt_utils", "transformers").safe_globals():
                state = torch.load(written, weights_only=True)
            self._ckptzip_save(state, os.path.join(output_dir, self._rng_file() + ".ckz"))
            os.remove(written)

    # -- resuming -------------------------------------------------------------------------
    def _ckptzip_state(self, checkpoint: str) -> Any:
        """``checkpoint``'s ``state.ckz`` decoded (once for both the weights and the optimizer)."""
        path = os.path.join(checkpoint, STATE_FILE)
        if self._ckptzip_loaded is None or self._ckptzip_loaded[0] != path:
            self._ckptzip_loaded = (path, load(path, threads=self.ckptzip_threads))
        return self._ckptzip_loaded[1]

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        path = os.path.join(resume_from_checkpoint, MODEL_FILE)
        if os.path.isfile(os.path.join(resume_from_checkpoint, STATE_FILE)):
            weights = self._ckptzip_state(resume_from_checkpoint)["model"]
        elif os.path.isfile(path):
            weights = load(path)
        else:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            return
        target = model if model is not None else self.model
        self._issue_warnings_after_load(target.load_state_dict(weights, strict=False))

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        if best is not None and any(os.path.isfile(os.path.join(best, name))
                                    for name in (MODEL_FILE, STATE_FILE)):
            self._load_from_checkpoint(best)
            self._ckptzip_loaded = None
        else:
            super()._load_best_model()

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is not None and os.path.isfile(os.path.join(checkpoint, STATE_FILE)):
            state = self._ckptzip_state(checkpoint)
            self._ckptzip_loaded = None
            if "optimizer" not in state:
                raise Error(f"{os.path.join(checkpoint, STATE_FILE)} holds no optimizer state (it was "
                            "saved with save_only_model); resume from a checkpoint that has one")
            self.optimizer.load_state_dict(state["optimizer"])
            self.lr_scheduler.load_state_dict(load(os.path.join(checkpoint, SCHEDULER_FILE)))
            self._ckptzip_resumed_from = checkpoint  # the next delta goes on from it as decoded
            path = os.path.abspath(os.path.join(checkpoint, STATE_FILE))
            if worth_holding(sum(leaf.nbytes for leaf in flatten(state)[1]),
                             self.ckptzip_cache_decoded, self.args.output_dir):
                self._ckptzip_held = hold_loaded(path, state)  # the next delta's base, decoded
            return
        if checkpoint is None or not os.path.isfile(os.path.join(checkpoint, OPTIMIZER_FILE)):
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        self.optimizer.load_state_dict(load(os.path.join(checkpoint, OPTIMIZER_FILE)))
        self.lr_scheduler.load_state_dict(load(os.path.join(checkpoint, SCHEDULER_FILE)))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        path = None if checkpoint is None else os.path.join(checkpoint, self._rng_file() + ".ckz")
        if path is None or not os.path.isfile(path):
            super()._load_rng_state(checkpoint)
            return
        # The Trainer restores every device's generator from a torch file: give it one.
        with tempfile.TemporaryDirectory() as scratch:
            torch.save(load(path), os.path.join(scratch, self._rng_file() + ".pth"))
            super()._load_rng_state(scratch)


def _base_of(path: str) -> str | None:
    """The base file ``path``'s header names (None: a keyframe)."""
    with open_checkpoint(path) as checkpoint:
        ref = checkpoint.header.base
    return None if ref is None or ref.path is None else os.path.normpath(resolve_relative(path, ref.path))


def _chain(path: str) -> list[str]:
    """``path`` and its base chain's files, nearest first, as far as they can be read."""
    def base_of(current: str) -> str | None:
        try:
            return _base_of(current)
        except (Error, OSError):
            return None

    return walk_chain(path, base_of) if os.path.isfile(path) else []


def _delete_unneeded(doomed: list[str], kept: list[str]) -> None:
    """Delete the ``doomed`` checkpoint folders (oldest first in the list), except those the
    chain of a ``kept`` one's ``state.ckz`` needs; newest first, so that a crash midway leaves
    whole chains."""
    needed = {os.path.abspath(os.path.dirname(path)) for folder in kept
              for path in _chain(os.path.join(folder, STATE_FILE))}
    for folder in reversed(doomed):
        if os.path.abspath(folder) not in needed:
            shutil.rmtree(folder, ignore_errors=True)


def _drop_dependents(folder: str) -> None:
    """Before ``folder``'s ``state.ckz`` is written again (a run resumed from an earlier
    checkpoint saves over the later ones it left), delete the later checkpoints whose chains go
    through it: they would no longer load, and ``resume_from_checkpoint=True`` would pick the
    newest of them. Newest first, so that a crash midway leaves whole chains."""
    own = os.path.abspath(os.path.join(folder, STATE_FILE))
    if not os.path.isfile(own):
        return
    for later in reversed(_checkpoints(os.path.dirname(os.path.dirname(own)), after=folder)):
        if own in map(os.path.abspath, _chain(os.path.join(later, STATE_FILE))[1:]):
            log.warning("ckptzip: deleting %s: its delta chain goes through %s, which this run "
                        "writes anew", later, folder)
            shutil.rmtree(later, ignore_errors=True)


def _checkpoints(run_dir: str, *, before: str | None = None, after: str | None = None) -> list[str]:
    """The ``checkpoint-N`` folders of ``run_dir``, by step, those before or after the step of
    the folder named ``before`` or ``after`` only."""
    def step(name: str | None, default: int) -> int:
        found = None if name is None else CHECKPOINT_FOLDER.fullmatch(
            os.path.basename(os.path.normpath(name)))
        return default if found is None else int(found.group(1))

    if not os.path.isdir(run_dir):
        return []
    low, high = step(after, -1), step(before, 1 << 62)
    folders = sorted((step(name, -1), os.path.join(run_dir, name)) for name in os.listdir(run_dir))
    return [path for number, path in folders if number >= 0 and low < number < high]


def _previous_state(folder: str) -> str | None:
    """The newest ``state.ckz`` of a checkpoint before ``folder`` (same run directory) whose
    chain is whole (every file there and readable): the base of ``folder``'s; None for a
    keyframe."""
    if CHECKPOINT_FOLDER.fullmatch(os.path.basename(os.path.normpath(folder))) is None:
        return None
    for earlier in reversed(_checkpoints(os.path.dirname(os.path.normpath(folder)), before=folder)):
        path = os.path.join(earlier, STATE_FILE)
        if not os.path.isfile(path):
            continue
        try:
            chain = walk_chain(path, _base_of)
        except (Error, OSError):
            continue  # unreadable, or a base of it gone: an older one may do
        if all(os.path.isfile(p) for p in chain):
            return path
    return None


def __getattr__(name: str) -> Any:
    """``CkptzipTrainer``: ``transformers.Trainer`` with :class:`CkptzipTrainerMixin`, made on
    first use so that importing this module does not import transformers."""
    if name != "CkptzipTrainer":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    transformers = require("transformers", "transformers")
    trainer = type("CkptzipTrainer", (CkptzipTrainerMixin, transformers.Trainer), {
        "__module__": __name__,
        "__doc__": "``transformers.Trainer`` whose checkpoints are ckptzip files.",
    })
    globals()[name] = trainer
    return trainer
