"""The Hugging Face Trainer the integration tests train: ``CkptzipTrainer`` over a one-layer GPT-2
and 32 random sequences, on CPU (tests/test_integrations.py, and tests/deepspeed_worker.py under
DeepSpeed)."""

from __future__ import annotations

from typing import Any

import torch


def tiny_gpt_trainer(directory: str, trainer_options: dict[str, Any] | None = None,
                     **arguments: Any) -> Any:
    """A ``CkptzipTrainer`` saving every 2 steps into ``directory``; ``trainer_options`` are the
    trainer's own keyword arguments (``ckptzip_mode``, ``eval_dataset``, ...), ``arguments`` go
    to ``TrainingArguments`` (``max_steps`` among them)."""
    import transformers

    from ckptzip.integrations.hf import CkptzipTrainer

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=64, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 64, (32, 16), generator=generator)]
    args = transformers.TrainingArguments(
        directory, per_device_train_batch_size=4, save_steps=2, use_cpu=True, report_to=[],
        disable_tqdm=True, seed=3, **arguments)
    return CkptzipTrainer(model=model, args=args, train_dataset=data, **(trainer_options or {}))
