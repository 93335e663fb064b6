"""Lightning's checkpoints as its ModelCheckpoint writes them and through ckptzip, on a real fine-tune.

The task is hf_trainer.py's (and fidelity.py's ``minilm-full``): the all-MiniLM-L6-v2 weights
(13.9M parameters, vocabulary trimmed to the KJV's tokens) and a new head classify which of the
KJV's 66 books a verse is from; AdamW at PyTorch's defaults, lr 1e-4, warmup from 0 over 10 steps
then linear decay, batch 16 verses (shuffled by a fixed generator), ``--steps`` steps with a
checkpoint every ``--every``. Each arm fits from the same weights on the same batches; what
differs is how its checkpoints are written:

- ``lightning``: ``ModelCheckpoint(every_n_train_steps=..., save_top_k=-1)`` with Lightning's
  own ``torch.save``: the peer, as its users run it;
- ``ckptzip-io``: the same ``ModelCheckpoint`` through ``CkptzipCheckpointIO`` (standalone,
  lossless);
- ``lossless-deltas``: ``CkptzipCheckpoint(mode="lossless")`` (a CheckpointManager: bit-exact
  deltas against the previous checkpoint, a keyframe every 8, saved in the background);
- ``adaptive``: ``CkptzipCheckpoint(mode="adaptive")`` likewise;
- ``none``: no checkpoints, for the fit's time without any.

Per arm: each checkpoint file's bytes (the first a keyframe for the delta arms), the full
training state's raw bytes (fp32 weights and Adam's two moments) over the mean file, the seconds
the checkpoint callback held the training loop at each checkpoint (``on_train_batch_end``: the
whole save for ``ModelCheckpoint``, the host snapshot for the background saves), the fit's wall
seconds (training and every save, the background ones included, as they finish before the fit
returns), and the validation loss of the model decoded from the last checkpoint beside the trained
model's (open loop). ``--quick``: hf_trainer.py's tiny GPT-2 on random tokens, for the test.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from common import info_markdown
from hf_trainer import (
    evaluate,
    fine_tune_arguments,
    run_fine_tune,
    size_cells,
    write_fine_tune,
)
from torch import nn

import ckptzip

ARMS = ("lightning", "ckptzip-io", "lossless-deltas", "adaptive", "none")


def lightning_module(model: nn.Module, steps: int) -> Any:
    import lightning

    class Fit(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch: dict[str, torch.Tensor], index: int) -> torch.Tensor:
            loss: torch.Tensor = self.model(**batch)["loss"]
            return loss

        def configure_optimizers(self) -> Any:
            optimizer = torch.optim.AdamW(self.parameters(), lr=1e-4, weight_decay=0.0)

            def factor(step: int) -> float:  # the HF Trainer's linear schedule with warmup
                return step / 10 if step < 10 else max(0.0, (steps - step) / max(1, steps - 10))

            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    return Fit()


def collate(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.stack([row[key] for row in rows]) for key in rows[0]}


def run_arm(name: str, task: Any, steps: int, every: int, work: Path) -> dict[str, Any]:
    import lightning
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

    from ckptzip.integrations.lightning import CkptzipCheckpoint, CkptzipCheckpointIO

    make_model, train_rows, held_rows = task
    directory = work / name
    directory.mkdir(parents=True, exist_ok=True)
    if name == "none":
        callback: Any = lightning.Callback()
    elif name in ("lightning", "ckptzip-io"):
        callback = ModelCheckpoint(dirpath=directory, every_n_train_steps=every,
                                        save_top_k=-1, save_last=False)
    else:
        mode = "lossless" if name == "lossless-deltas" else "adaptive"
        callback = CkptzipCheckpoint(directory, every_n_train_steps=every, mode=mode)
    stalls: list[float] = []
    inner = callback.on_train_batch_end

    def timed(trainer: Any, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        inner(trainer, *args, **kwargs)
        if trainer.global_step % every == 0:
            stalls.append(time.perf_counter() - started)

    callback.on_train_batch_end = timed
    plugins: list[Any] = [] if name in ("lightning", "none") else [CkptzipCheckpointIO()]
    trainer = lightning.Trainer(
        max_steps=steps, default_root_dir=directory, logger=False, enable_progress_bar=False,
        enable_model_summary=False, accelerator="cpu", plugins=plugins, callbacks=[callback],
        num_sanity_val_steps=0, limit_val_batches=0,
        enable_checkpointing=isinstance(callback, ModelCheckpoint))  # no default one beside ours
    model = make_model()
    module = lightning_module(model, steps)
    loader = DataLoader(train_rows, batch_size=16, shuffle=True, collate_fn=collate,
                        generator=torch.Generator().manual_seed(3))
    started = time.perf_counter()
    trainer.fit(module, loader)
    fit_seconds = time.perf_counter() - started
    files = sorted((p for p in directory.iterdir() if p.suffix in (".ckpt", ".ckz")),
                   key=lambda p: int(p.stem.split("step=")[-1].split("-")[-1]))
    sizes = [p.stat().st_size for p in files]
    if name == "none":
        return {"arm": name, "files": [], "file_bytes": [], "delta": [], "stall_seconds": [],
                "fit_seconds": fit_seconds}
    deltas = [False] * len(files)
    if name in ("lossless-deltas", "adaptive"):
        deltas = []
        for path in files:
            with ckptzip.open(path) as checkpoint:
                deltas.append(checkpoint.chain_depth > 0)
    if name == "lightning":
        last = torch.load(files[-1], map_location="cpu", weights_only=False)
    else:
        last = ckptzip.load(files[-1])
    weights = {k.removeprefix("model."): v for k, v in last["state_dict"].items()}
    decoded = make_model()
    missing, unexpected = decoded.load_state_dict(weights, strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    raw = sum(p.numel() * 4 * 3 for p in model.parameters() if p.requires_grad)
    return {"arm": name, "files": [p.name for p in files], "file_bytes": sizes, "delta": deltas,
            "raw_state_bytes": raw, "stall_seconds": stalls, "fit_seconds": fit_seconds,
            "val_loss_trained": evaluate(model, held_rows),
            "val_loss_decoded_last": evaluate(decoded, held_rows)}


def main() -> None:
    args = fine_tune_arguments(__doc__.splitlines()[0], "lightning_fit")
    info, results, what = run_fine_tune(
        args, ARMS, run_arm, "ckptzip-lightning-bench-",
        lambda r: f"{len(r['files'])} checkpoints, fit {r['fit_seconds']:.1f} s")
    lines = [f"# Lightning's checkpoints ({what})", "", info_markdown(info), "",
             f"{args.steps} steps, a checkpoint every {args.every}; raw state = fp32 weights and "
             "Adam's two moments of the trained parameters; stall = seconds the checkpoint "
             "callback held the training loop at a checkpoint.", "",
             "| arm | standalone files: n, mean bytes | delta files: n, mean bytes | raw state / "
             "mean delta | raw state / mean file | stall s: mean [min, max] | fit s | val loss: "
             "trained / decoded last |",
             "|---|---:|---:|---:|---:|---|---:|---|"]
    for r in results:
        if not r["files"]:
            lines.append(f"| {r['arm']} | - | - | - | - | - | {r['fit_seconds']:.1f} | - |")
            continue
        stalls = r["stall_seconds"]
        lines.append(
            f"| {r['arm']} | {size_cells(r['file_bytes'], r['delta'], r['raw_state_bytes'])} | "
            f"{statistics.mean(stalls):.3f} [{min(stalls):.3f}, {max(stalls):.3f}] | "
            f"{r['fit_seconds']:.1f} | {r['val_loss_trained']:.4f} / "
            f"{r['val_loss_decoded_last']:.4f} |")
    write_fine_tune(args, "lightning_fit", lines, info, results)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
