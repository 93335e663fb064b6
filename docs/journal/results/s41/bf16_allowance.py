"""What tightening the 16-bit "no worse than nothing" allowance costs: one pure-bf16 AdamW run of
a 4-layer GPT on the demo's text, a lossless keyframe, then 8 deltas 10 steps apart, each mode's
chain saved twice from the same states, with the allowance at its old value (2 + 2^-8, for the
rounding to the dtype) and at the 4-byte one (1 + 2^-9). Prints each chain's stored bytes, the
full-state ratio over the deltas, and each decoded tensor's largest error over "storing nothing"
(the update left out, or the moment zero), where more than 1 means worse than nothing.

    CKPTZIP_MALLOC=system python docs/journal/results/s41/bf16_allowance.py
"""

from __future__ import annotations

import os
import tempfile
import warnings

import torch

import ckptzip
from ckptzip.demo.data import get_batch, load_corpus
from ckptzip.demo.gpt import GPT, GPTConfig
from ckptzip.modes import common

torch.manual_seed(0)
torch.set_num_threads(2)
config = GPTConfig(n_layer=4, n_head=4, n_embd=256, block_size=64)
model = GPT(config).to(torch.bfloat16)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
data = load_corpus(2 << 20)
generator = torch.Generator().manual_seed(1)


def train(steps: int) -> float:
    for _ in range(steps):
        x, y = get_batch(data, 16, config.block_size, generator)
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return float(loss)


def flat(state: object, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(flat(v, f"{prefix}.{i}" if prefix else str(i)))
    elif isinstance(state, torch.Tensor):
        out[prefix] = state.detach().clone()
    return out


def state() -> dict:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


ALLOWANCES = {"old 2+2^-8": 2 + 2**-8, "new 1+2^-9": 1 + 2**-9}
MODES = ("excp", "bitsnap", "adaptive")
folder = tempfile.mkdtemp()
train(40)
keyframe = os.path.join(folder, "k.ckz")
ckptzip.save(state(), keyframe)
raw = sum(t.numel() * 12 for t in model.parameters())  # fp32 weights + both moments
params = sum(t.numel() for t in model.parameters())
print(f"GPT {params / 1e6:.2f}M parameters, bf16 weights and moments; ratio against fp32 bytes "
      f"(12 a parameter, the scoreboard's full-state measure)")
previous = {(m, a): keyframe for m in MODES for a in ALLOWANCES}
before = {(m, a): flat(state()) for m in MODES for a in ALLOWANCES}
stored = {(m, a): 0 for m in MODES for a in ALLOWANCES}
worst = {(m, a): 0.0 for m in MODES for a in ALLOWANCES}
for k in range(8):
    loss = train(10)
    true = flat(state())
    for mode in MODES:
        for label, allowance in ALLOWANCES.items():
            common.NO_WORSE_NARROW = allowance
            path = os.path.join(folder, f"{mode}-{label[:3]}-{k}.ckz")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                report = ckptzip.save(state(), path, mode=mode, base=previous[(mode, label)])
            stored[(mode, label)] += report.stored_bytes
            decoded = flat(ckptzip.load(path))
            base = before[(mode, label)]
            for name, t in true.items():
                if not t.is_floating_point() or t.numel() < 16:
                    continue
                error = float((decoded[name].double() - t.double()).norm())
                moment = "exp_avg" in name
                nothing = float((t.double() if moment else t.double() - base[name].double()).norm())
                if nothing > 0:
                    worst[(mode, label)] = max(worst[(mode, label)], error / nothing)
            before[(mode, label)] = decoded
            previous[(mode, label)] = path
    print(f"delta {k}: train loss {loss:.3f}")
print(f"{'mode':9s} {'allowance':12s} {'delta bytes':>12s} {'ratio':>8s} {'worst error / nothing':>22s}")
for mode in MODES:
    for label in ALLOWANCES:
        total = stored[(mode, label)]
        print(f"{mode:9s} {label:12s} {total:12d} {8 * raw / total:8.1f} {worst[(mode, label)]:22.4f}")
