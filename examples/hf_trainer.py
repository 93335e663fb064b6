"""A Hugging Face Trainer whose checkpoints are ckptzip files: trains a tiny GPT-2 for a few steps
on CPU with save_total_limit=2, resumes with trainer.train(resume_from_checkpoint=...), and prints
each checkpoint file's size beside what the Trainer would have written.

    python examples/hf_trainer.py --steps 8                    # lossless, standalone: resumes bit for bit
    python examples/hf_trainer.py --steps 8 --mode adaptive    # lossy deltas against the last checkpoint
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments

from ckptzip.integrations.hf import CkptzipTrainer


def trainer(output_dir: str, steps: int, mode: str) -> CkptzipTrainer:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=256, n_positions=32,
                        bos_token_id=0, eos_token_id=0)
    generator = torch.Generator().manual_seed(1)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 256, (64, 32), generator=generator)]
    args = TrainingArguments(output_dir, max_steps=steps, per_device_train_batch_size=8, save_steps=2,
                             save_total_limit=2, use_cpu=True, report_to=[], disable_tqdm=True)
    return CkptzipTrainer(model=GPT2LMHeadModel(config), args=args, train_dataset=data,
                          ckptzip_mode=mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="output directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--mode", default="lossless",
                        help="lossless (default) or a lossy mode (adaptive, excp, bitsnap): deltas")
    args = parser.parse_args()
    output_dir = args.dir or tempfile.mkdtemp(prefix="ckptzip-hf-")

    first = trainer(output_dir, args.steps, args.mode)
    first.train()
    checkpoints = sorted(os.listdir(output_dir), key=lambda name: int(name.split("-")[-1]))
    print(f"checkpoints kept (save_total_limit=2, and the bases a delta needs): {checkpoints}")
    earlier = os.path.join(output_dir, checkpoints[0])
    for checkpoint in checkpoints:
        for name in sorted(os.listdir(os.path.join(output_dir, checkpoint))):
            if name.endswith(".ckz"):
                size = os.path.getsize(os.path.join(output_dir, checkpoint, name))
                print(f"  {checkpoint}/{name}: {size:,} bytes")
    model = first.model.state_dict()
    raw = sum(p.numel() * p.element_size() for p in first.model.parameters())
    print(f"  (the raw weights alone are {raw:,} bytes; Adam's two moments as much again each)")

    resumed = trainer(output_dir, args.steps, args.mode)
    resumed.train(resume_from_checkpoint=earlier)
    gap = max(float((model[k] - v).abs().max()) for k, v in resumed.model.state_dict().items())
    print(f"resumed from {checkpoints[0]} to step {resumed.state.global_step}; largest weight "
          f"difference from the uninterrupted run: {gap:.3g}")
    if args.mode == "lossless" and gap != 0:
        raise SystemExit("the resumed run differs")


if __name__ == "__main__":
    main()
