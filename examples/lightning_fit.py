"""Lightning with ckptzip: fits a tiny GPT for a few steps on CPU, twice.

First with the CheckpointIO plugin under AsyncCheckpointIO and Lightning's ModelCheckpoint: keeps
the best 2 checkpoints (standalone, lossless), resumes from one with trainer.fit(ckpt_path=...),
and prints the checkpoint sizes beside torch.save's. Then with the CkptzipCheckpoint callback in
``--mode`` (default adaptive): a chain of deltas in a CheckpointManager directory, their sizes, and
a resume from its first file (the keyframe, lossless, so the run ends where the first did).

    python examples/lightning_fit.py --steps 8
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from torch.utils.data import DataLoader, TensorDataset

import ckptzip
from ckptzip.demo.gpt import GPT, GPTConfig
from ckptzip.integrations.lightning import CkptzipCheckpoint, CkptzipCheckpointIO


class TinyGPT(L.LightningModule):
    def __init__(self, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.gpt = GPT(GPTConfig.tiny())

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        (tokens,) = batch
        _, loss = self.gpt(tokens[:, :-1], tokens[:, 1:])
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def fit(root: str, steps: int, ckpt_path: str | None = None, deltas: str | None = None) -> TinyGPT:
    """Fit with the plugin and ModelCheckpoint, or (``deltas``: a mode) with CkptzipCheckpoint."""
    torch.manual_seed(0)
    data = TensorDataset(torch.randint(0, 256, (16, 33)))  # 2 steps per epoch
    if deltas is None:
        plugin: Any = AsyncCheckpointIO(CkptzipCheckpointIO())
        callback: Any = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=2,
                                        monitor="step", mode="max")
    else:
        plugin = CkptzipCheckpointIO()  # reads the step files back on ckpt_path=
        callback = CkptzipCheckpoint(root, every_n_train_steps=2, mode=deltas)
    trainer = L.Trainer(
        max_steps=steps, default_root_dir=root, logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", plugins=[plugin], callbacks=[callback],
        enable_checkpointing=deltas is None,
    )
    module = TinyGPT()
    trainer.fit(module, DataLoader(data, batch_size=8), ckpt_path=ckpt_path)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="checkpoint directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mode", default="adaptive", help="the CkptzipCheckpoint run's mode")
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="ckptzip-lightning-")

    module = fit(root, args.steps)
    names = sorted((n for n in os.listdir(root) if n.endswith(".ckpt")),
                   key=lambda n: os.path.getmtime(os.path.join(root, n)))  # reruns add -v1 names
    print(f"checkpoints kept (save_top_k=2): {names}")
    for name in names:
        path = os.path.join(root, name)
        buffer = io.BytesIO()
        torch.save(ckptzip.load(path), buffer)
        print(f"  {name}: {os.path.getsize(path):,} bytes (torch.save: {buffer.tell():,})")

    resumed = fit(os.path.join(root, "resumed"), args.steps, ckpt_path=os.path.join(root, names[0]))
    same = all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), resumed.state_dict().values()))
    print(f"resumed from {names[0]} to step {args.steps}; matches: {same}")

    chain = os.path.join(root, "deltas")
    fit(chain, args.steps, deltas=args.mode)
    steps = sorted(n for n in os.listdir(chain) if n.startswith("step-"))
    print(f"CkptzipCheckpoint(mode={args.mode!r}) chain: {steps}")
    for name in steps:
        path = os.path.join(chain, name)
        buffer = io.BytesIO()
        torch.save(ckptzip.load(path), buffer)
        with ckptzip.open(path) as checkpoint:
            kind = "delta" if checkpoint.chain_depth else "keyframe"
        print(f"  {name}: {kind}, {os.path.getsize(path):,} bytes (torch.save: {buffer.tell():,})")
    print(f"  newest restorable (CkptzipCheckpoint.latest, what a restart resumes from): "
          f"{os.path.basename(CkptzipCheckpoint.latest(chain) or '-')}")
    # from the keyframe, rewriting the deltas after it
    again = fit(chain, args.steps, ckpt_path=os.path.join(chain, steps[0]), deltas=args.mode)
    same_again = all(torch.equal(a, b) for a, b in zip(module.state_dict().values(),
                                                       again.state_dict().values()))
    print(f"resumed from {steps[0]} (the keyframe) to step {args.steps}; matches: {same_again}")
    if not (same and same_again):
        raise SystemExit("a resumed run differs")


if __name__ == "__main__":
    main()
