"""A plain PyTorch loop checkpointed with ckptzip.CheckpointManager: saves in the background every
few steps (deltas against the previous checkpoint, a keyframe every 4), keeps the last 3 restorable,
then resumes from the latest and checks that the resumed run matches the uninterrupted one.

    python examples/plain_loop.py --steps 20 --every 5
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch

import ckptzip
from ckptzip.demo.gpt import GPT, GPTConfig


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, 256, (8, 33), generator=torch.Generator().manual_seed(step))


def train(model: GPT, optimizer: torch.optim.Optimizer, steps: range) -> None:
    for step in steps:
        tokens = batch(step)
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def fresh() -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="checkpoint directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args()
    directory = args.dir or tempfile.mkdtemp(prefix="ckptzip-plain-")

    model, optimizer = fresh()
    with ckptzip.CheckpointManager(directory, keep_last=3, keyframe_every=4) as manager:
        for start in range(0, args.steps, args.every):
            train(model, optimizer, range(start, start + args.every))
            step = start + args.every
            manager.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "step": step})
        manager.wait()
        resume_at = manager.steps()[-2]  # resume from the one before last, then catch up
        state = manager.restore(resume_at)
        print(f"checkpoints kept: {manager.steps()}; resuming from step {resume_at}")

    resumed, resumed_optimizer = fresh()
    resumed.load_state_dict(state["model"])
    resumed_optimizer.load_state_dict(state["optimizer"])
    train(resumed, resumed_optimizer, range(state["step"], args.steps))
    pairs = zip(model.state_dict().values(), resumed.state_dict().values())
    same = all(torch.equal(a, b) for a, b in pairs)
    print(f"resumed from step {resume_at} to step {args.steps}; matches: {same}")

    for name in sorted(os.listdir(directory)):
        if name.endswith(".ckz"):
            with ckptzip.open(os.path.join(directory, name)) as checkpoint:
                depth = checkpoint.chain_depth
                # the state's own bytes, as stored: a tied weight once, as ckptzip inspect counts
                raw = sum(leaf.nbytes for leaf in checkpoint.leaves)
            kind = "keyframe" if depth == 0 else f"delta (depth {depth})"
            size = os.path.getsize(os.path.join(directory, name))
            print(f"{name}: {size:,} bytes ({raw / size:.2f}x smaller than the raw state), {kind}")
    if not same:
        raise SystemExit("the resumed run differs")


if __name__ == "__main__":
    main()
