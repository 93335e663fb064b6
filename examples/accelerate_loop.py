"""An Accelerate loop: accelerator.save_state/load_state write the model as model.ckz through
ckptzip's hooks (Accelerate's hooks cover model weights only, so its optimizer.bin stays a torch
file), and a CheckpointManager beside it holds the whole training state compressed. Trains a tiny
GPT for a few steps on CPU, resumes from both, and prints the sizes.

    python examples/accelerate_loop.py --steps 6
"""

from __future__ import annotations

import argparse
import os
import tempfile

import torch
from accelerate import Accelerator

import ckptzip
from ckptzip.demo.gpt import GPT, GPTConfig
from ckptzip.integrations.accelerate import register


def setup() -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    register(accelerator)
    return accelerator, model, optimizer


def train(accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
          steps: range) -> None:
    for step in steps:
        tokens = torch.randint(0, 256, (8, 33), generator=torch.Generator().manual_seed(step))
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        optimizer.zero_grad()
        accelerator.backward(loss)
        optimizer.step()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="checkpoint directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    root = args.dir or tempfile.mkdtemp(prefix="ckptzip-accelerate-")
    half = args.steps // 2

    accelerator, model, optimizer = setup()
    train(accelerator, model, optimizer, range(half))
    state_dir = os.path.join(root, "save_state")
    accelerator.save_state(state_dir)
    with ckptzip.CheckpointManager(os.path.join(root, "manager"), async_save=False) as manager:
        manager.save(half, {"model": accelerator.get_state_dict(model), "optimizer": optimizer.state_dict()})
    train(accelerator, model, optimizer, range(half, args.steps))

    for name in sorted(os.listdir(state_dir)):
        print(f"save_state/{name}: {os.path.getsize(os.path.join(state_dir, name)):,} bytes")
    manager_file = os.path.join(root, "manager", ckptzip.manager.step_file(half))
    print(f"manager/{os.path.basename(manager_file)} (model + optimizer): "
          f"{os.path.getsize(manager_file):,} bytes")

    for source in ("save_state", "manager"):
        accelerator, resumed, resumed_optimizer = setup()
        if source == "save_state":
            accelerator.load_state(state_dir)
        else:
            with ckptzip.CheckpointManager(os.path.join(root, "manager")) as manager:
                state = manager.restore()
            accelerator.unwrap_model(resumed).load_state_dict(state["model"])
            resumed_optimizer.load_state_dict(state["optimizer"])
        train(accelerator, resumed, resumed_optimizer, range(half, args.steps))
        pairs = zip(model.state_dict().values(), resumed.state_dict().values())
        same = all(torch.equal(a, b) for a, b in pairs)
        print(f"resumed from {source} at step {half}; matches: {same}")
        if not same:
            raise SystemExit("the resumed run differs")


if __name__ == "__main__":
    main()
