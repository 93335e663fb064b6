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
tokenizer and ``trainer_state.json`` stay as they are. Every checkpoint is standalone (no delta),
so the Trainer's rotation by ``save_total_limit`` may delete any of them. ``trainer.save_model()``
outside checkpoints still writes plain safetensors for ``from_pretrained``. Under DeepSpeed the
engine's files (``global_stepN/``: its model and ZeRO optimizer states) go through ckptzip's
DeepSpeed checkpoint engine (:mod:`ckptzip.integrations.deepspeed`), attached once the Trainer has
built the engine, before it resumes; the Trainer's other files there stay as it writes them. Under
FSDP, XLA or SageMaker the Trainer's own files are written unchanged.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import torch

from ..api import load, save
from . import require, standalone_mode

MODEL_FILE = "model.ckz"
OPTIMIZER_FILE = "optimizer.ckz"
SCHEDULER_FILE = "scheduler.ckz"

#: The mixin's static base: the Trainer's attributes are dynamic to the type checker (they are
#: there at run time, through the real Trainer class after the mixin in the MRO).
_TrainerBase: Any = object


class CkptzipTrainerMixin(_TrainerBase):
    """Mix in before a ``transformers.Trainer`` class to compress its checkpoints.

    Extra keyword arguments: ``ckptzip_mode`` (default ``"lossless"``), ``ckptzip_threads`` and
    ``ckptzip_options`` (a dict of the mode's options), passed to :func:`ckptzip.save`.
    """

    def __init__(
        self,
        *args: Any,
        ckptzip_mode: str = "lossless",
        ckptzip_threads: int | None = None,
        ckptzip_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.ckptzip_mode = standalone_mode(ckptzip_mode, "Hugging Face's Trainer")
        super().__init__(*args, **kwargs)
        self.ckptzip_threads = ckptzip_threads
        self.ckptzip_options = dict(ckptzip_options or {})
        self._ckptzip_in_checkpoint = False

    def _ckptzip_applies(self) -> bool:
        """True on the single-process and DDP paths, where the Trainer writes plain torch files."""
        utils = require("transformers.utils", "transformers")
        return not (
            self.is_deepspeed_enabled or self.is_fsdp_enabled
            or utils.is_sagemaker_mp_enabled() or utils.is_torch_xla_available()
        )

    def _ckptzip_save(self, state: Any, path: str) -> None:
        save(state, path, mode=self.ckptzip_mode, threads=self.ckptzip_threads, **self.ckptzip_options)

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
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self._ckptzip_in_checkpoint = False

    def _save(self, output_dir: str | None = None, state_dict: dict[str, Any] | None = None) -> None:
        super()._save(output_dir, state_dict)
        directory = output_dir if output_dir is not None else self.args.output_dir
        weights = os.path.join(directory, "model.safetensors")
        if self._ckptzip_in_checkpoint and self.args.should_save and os.path.isfile(weights):
            from safetensors.torch import load_file

            self._ckptzip_save(load_file(weights), os.path.join(directory, MODEL_FILE))
            os.remove(weights)

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        if not self._ckptzip_in_checkpoint:
            super()._save_optimizer_and_scheduler(output_dir)
        elif self.args.should_save:
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
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        path = os.path.join(resume_from_checkpoint, MODEL_FILE)
        if not os.path.isfile(path):
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            return
        target = model if model is not None else self.model
        self._issue_warnings_after_load(target.load_state_dict(load(path), strict=False))

    def _load_best_model(self) -> None:
        best = self.state.best_model_checkpoint
        if best is not None and os.path.isfile(os.path.join(best, MODEL_FILE)):
            self._load_from_checkpoint(best)
        else:
            super()._load_best_model()

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
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
