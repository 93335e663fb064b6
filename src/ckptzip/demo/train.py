"""Training loop and full training state: what a user's checkpoint holds, and exact resume."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from ckptzip.demo.data import DEFAULT_MAX_BYTES, get_batch, load_corpus, split_corpus
from ckptzip.demo.gpt import GPT, GPTConfig, make_optimizer, make_scheduler


@dataclass(frozen=True)
class TrainConfig:
    """Hyperparameters of a demo run, besides the model's shape."""

    model: GPTConfig = field(default_factory=GPTConfig)
    batch_size: int = 16
    lr: float = 3e-4
    weight_decay: float = 0.1
    warmup_fraction: float = 0.1
    grad_clip: float = 1.0
    corpus_bytes: int = DEFAULT_MAX_BYTES


CONFIGS: dict[str, TrainConfig] = {
    "small": TrainConfig(),
    "tiny": TrainConfig(model=GPTConfig.tiny(), batch_size=8, corpus_bytes=1_000_000),
}


@dataclass
class Trainer:
    """The live objects of a run: everything `full_state` saves."""

    config: TrainConfig
    model: GPT
    optimizer: torch.optim.AdamW
    scheduler: LambdaLR
    generator: torch.Generator

    @property
    def step(self) -> int:
        """Optimizer steps taken so far in the whole run (the scheduler counts them)."""
        return self.scheduler.last_epoch

    def state(self) -> dict[str, Any]:
        """`full_state` of this run now. Tensors are not copied."""
        return full_state(self.model, self.optimizer, self.scheduler, self.step, self.generator)

    def restore(self, state: dict[str, Any]) -> int:
        """`restore_state` into this run; returns the step to continue from."""
        return restore_state(state, self.model, self.optimizer, self.scheduler, self.generator)

    def train(
        self,
        data: torch.Tensor,
        steps: int,
        on_step: Callable[[int, float], None] | None = None,
    ) -> list[float]:
        """`train_steps` with this run's objects, batch size and clipping."""
        return train_steps(
            self.model,
            self.optimizer,
            self.scheduler,
            data,
            self.generator,
            steps,
            self.config.batch_size,
            on_step=on_step,
            grad_clip=self.config.grad_clip,
        )


def make_trainer(config: TrainConfig, total_steps: int, seed: int = 0) -> Trainer:
    """Fresh model, optimizer, scheduler and data generator, all seeded from `seed`."""
    torch.manual_seed(seed)
    model = GPT(config.model)
    optimizer = make_optimizer(model, lr=config.lr, weight_decay=config.weight_decay)
    warmup = max(1, int(total_steps * config.warmup_fraction))
    scheduler = make_scheduler(optimizer, warmup, total_steps)
    generator = torch.Generator().manual_seed(seed)
    return Trainer(config, model, optimizer, scheduler, generator)


def load_data(config: TrainConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, val) token tensors for `config`."""
    return split_corpus(load_corpus(config.corpus_bytes))


def full_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    step: int,
    generator: torch.Generator,
) -> dict[str, Any]:
    """The complete training state, in the layout users checkpoint. Tensors are not copied."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "step": step,
        "rng": {"torch": torch.get_rng_state(), "data": generator.get_state()},
    }


def restore_state(
    state: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    generator: torch.Generator,
) -> int:
    """Load `state` (from `full_state`) into live objects; returns the step to continue from."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"])
    generator.set_state(state["rng"]["data"])
    return int(state["step"])


def train_steps(
    model: GPT,
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    data: torch.Tensor,
    generator: torch.Generator,
    steps: int,
    batch_size: int,
    on_step: Callable[[int, float], None] | None = None,
    grad_clip: float = 1.0,
) -> list[float]:
    """Run `steps` optimizer steps; returns each step's training loss.

    `on_step(step, loss)` is called after each step, with `step` the scheduler's count of
    steps taken so far in the whole run (so it survives a resume).
    """
    model.train()
    losses: list[float] = []
    for _ in range(steps):
        x, y = get_batch(data, batch_size, model.config.block_size, generator)
        _, loss = model(x, y)
        assert loss is not None
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(scheduler.last_epoch, losses[-1])
    return losses


def same_state(a: Any, b: Any) -> bool:
    """Whether two nested states are identical: same structure, types, and tensor bits."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(_bits(a), _bits(b))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, Mapping):
        return list(a) == list(b) and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, so that -0.0 differs from 0.0 and NaN equals itself."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


@torch.no_grad()
def evaluate(
    model: GPT,
    val_data: torch.Tensor,
    batches: int,
    batch_size: int,
    block_size: int,
    seed: int = 0,
) -> float:
    """Mean loss over `batches` batches drawn with their own seeded generator (deterministic)."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        x, y = get_batch(val_data, batch_size, block_size, generator)
        _, loss = model(x, y)
        assert loss is not None
        total += loss.item()
    model.train(was_training)
    return total / batches
