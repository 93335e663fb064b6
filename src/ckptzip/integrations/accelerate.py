"""Accelerate: ``Accelerator.save_state``/``load_state`` write and read each prepared model's
weights as ``model.ckz`` (``model_1.ckz``, ...) instead of ``model.safetensors``.

::

    from ckptzip.integrations.accelerate import register

    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    register(accelerator)
    accelerator.save_state("ckpt")      # ckpt/model.ckz
    accelerator.load_state("ckpt")

It uses Accelerate's documented pre-hooks, which cover model weights only: the optimizer,
scheduler, sampler and RNG files are still written by Accelerate with ``torch.save``. To compress
the whole training state, save ``accelerator.get_state_dict(model)`` and ``optimizer.state_dict()``
with :class:`ckptzip.CheckpointManager` (``examples/accelerate_loop.py`` shows both).

Under DeepSpeed, Accelerate has the engine write the model and its optimizer states
(``pytorch_model/``: ZeRO's partitions, the bulk of the bytes); ``register`` makes the engine's
checkpoint engine ckptzip's (:mod:`ckptzip.integrations.deepspeed`), so those are ckptzip files.
"""

from __future__ import annotations

import os
from typing import Any

from ..api import load, save
from . import standalone_mode


def model_file(index: int) -> str:
    """``model.ckz`` for the first model, ``model_<i>.ckz`` after it (Accelerate's numbering)."""
    return "model.ckz" if index == 0 else f"model_{index}.ckz"


def register(
    accelerator: Any, *, mode: str = "lossless", threads: int | None = None, **mode_options: Any
) -> tuple[Any, Any]:
    """Register the save and load hooks on ``accelerator``; returns their handles (``.remove()``
    undoes it). ``mode``, ``threads`` and ``mode_options`` go to :func:`ckptzip.save`; the files
    are standalone, so ``mode`` is lossless (:func:`~ckptzip.integrations.standalone_mode`)."""
    standalone_mode(mode, "Accelerate's save_state")

    def save_weights(models: list[Any], weights: list[dict[str, Any]], output_dir: str) -> None:
        writer = (
            accelerator.is_local_main_process
            if accelerator.project_configuration.save_on_each_node
            else accelerator.is_main_process
        )
        if writer:
            for index, state in enumerate(weights):
                save(state, os.path.join(output_dir, model_file(index)), mode=mode, threads=threads,
                     **mode_options)
        weights.clear()  # written: Accelerate writes no model file of its own

    def load_weights(models: list[Any], input_dir: str) -> None:
        if not os.path.isfile(os.path.join(input_dir, model_file(0))):
            return  # a checkpoint saved without the hooks: Accelerate reads its own files
        for index, model in enumerate(models):
            model.load_state_dict(load(os.path.join(input_dir, model_file(index)), threads=threads))
        models.clear()

    deepspeed = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if deepspeed is not None:  # the engine writes the model and optimizer files itself
        from .deepspeed import attach

        attach(deepspeed.engine, mode=mode, threads=threads, **mode_options)
    return (
        accelerator.register_save_state_pre_hook(save_weights),
        accelerator.register_load_state_pre_hook(load_weights),
    )
