"""One rank of the Lightning DDP test, launched by tests/test_integrations.py with torchrun (gloo,
CPU; Lightning sees torchrun's environment and launches nothing itself).

``DIR MODE``: a 64-wide MLP trains 6 steps under ``strategy="ddp"`` on 2 ranks with
:class:`~ckptzip.integrations.lightning.CkptzipCheckpoint` every 2 steps into ``DIR/run``; then a
new Trainer resumes from ``step-00000004.ckz`` into ``DIR/again`` and trains to step 6. Rank 0
saves ``DIR/<run>.pt`` (both runs' final weights, torch.save) for the test to compare. Every rank
prints ``ok RANK`` at the end.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import lightning
import torch
from torch.utils.data import DataLoader, TensorDataset

from ckptzip.integrations.lightning import CkptzipCheckpoint, CkptzipCheckpointIO


class Regression(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(root: str, run: str, mode: str, ckpt_path: str | None = None) -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 64), torch.randn(64, 1))  # 4 steps an epoch on 2 ranks
    trainer = lightning.Trainer(
        max_steps=6, default_root_dir=root, logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", devices=2, strategy="ddp",
        enable_checkpointing=False, plugins=[CkptzipCheckpointIO()],
        callbacks=[CkptzipCheckpoint(os.path.join(root, "run"), every_n_train_steps=2, mode=mode)])
    module = Regression()
    trainer.fit(module, DataLoader(data, batch_size=8), ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        torch.save(module.state_dict(), os.path.join(root, f"{run}.pt"))


def main() -> None:
    root, mode = sys.argv[1], sys.argv[2]
    fit(root, "full", mode)
    fit(root, "again", mode, ckpt_path=os.path.join(root, "run", "step-00000004.ckz"))
    print(f"ok {os.environ['RANK']}", flush=True)


if __name__ == "__main__":
    main()
