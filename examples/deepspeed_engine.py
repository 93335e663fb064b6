"""A DeepSpeed engine checkpointed with ckptzip: ``CkptzipCheckpointEngine`` writes
``engine.save_checkpoint``'s files (DeepSpeed's names, ``mp_rank_00_model_states.pt`` and the
rest) as ckptzip containers. Trains a tiny GPT with ZeRO stage 2 (``--zero-stage``: 0 to 3) and
bf16 (``--fp32``: without) on CPU in one process, saves half way, resumes a fresh engine from the
checkpoint, and checks that it matches the uninterrupted run; prints the files' sizes.

    DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed    # not among ckptzip's extras
    python examples/deepspeed_engine.py --steps 6

Without DeepSpeed installed it says so and exits with status 0.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from typing import Any

import torch

from ckptzip.demo.gpt import GPT, GPTConfig


def one_process_group() -> None:
    """The environment DeepSpeed reads for a world of one, unless a launcher set it."""
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as probe:  # a free port
            probe.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(probe.getsockname()[1])
    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("RANK", "0"), ("WORLD_SIZE", "1"),
                       ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)


def engine(zero_stage: int, bf16: bool) -> Any:
    import deepspeed

    from ckptzip.integrations.deepspeed import CkptzipCheckpointEngine

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    config = {"train_batch_size": 8,
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": zero_stage}, "zero_allow_untested_optimizer": True,
              "bf16": {"enabled": bf16}}
    ds_engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                         config=config)
    ds_engine.checkpoint_engine = CkptzipCheckpointEngine()  # or ckptzip...deepspeed.attach(engine)
    return ds_engine


def train(ds_engine: Any, steps: range) -> None:
    for step in steps:
        tokens = torch.randint(0, 256, (8, 33), generator=torch.Generator().manual_seed(step))
        _, loss = ds_engine(tokens[:, :-1], tokens[:, 1:])
        ds_engine.backward(loss)
        ds_engine.step()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="checkpoint directory (default: a temporary one)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--zero-stage", type=int, choices=range(4), default=2,
                        help="ZeRO stage (default 2: optimizer states and gradients partitioned)")
    parser.add_argument("--fp32", action="store_true", help="train in fp32, not bf16")
    args = parser.parse_args()
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        print("deepspeed is not installed: skipped (DS_BUILD_OPS=0 pip install deepspeed to run it)")
        return 0
    one_process_group()
    directory = args.dir or tempfile.mkdtemp(prefix="ckptzip-deepspeed-")
    half = args.steps // 2

    first = engine(args.zero_stage, not args.fp32)
    train(first, range(half))
    first.save_checkpoint(directory)
    train(first, range(half, args.steps))
    for root, _, files in sorted(os.walk(directory)):
        for name in sorted(files):
            path = os.path.join(root, name)
            print(f"{os.path.relpath(path, directory)}: {os.path.getsize(path):,} bytes")

    resumed = engine(args.zero_stage, not args.fp32)
    resumed.load_checkpoint(directory)
    train(resumed, range(half, args.steps))
    pairs = zip(first.module.state_dict().values(), resumed.module.state_dict().values())
    same = all(torch.equal(a, b) for a, b in pairs)
    print(f"resumed from the step-{half} checkpoint; matches: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
