"""Bits per weight that the adaptive search and a uniform quantizer need for the same error.

Trains the fidelity benchmark's model (``fidelity.FULL``) for 80 steps, takes the weight residual
between steps 60 and 80, and for every tensor of more than 1,000 elements finds, at relative
errors 0.22, 0.35 and 0.5 (least-squares, as the adaptive budget bounds them):

* ``kmeans``: the adaptive search's pruning-plus-k-means family alone (order-0 entropy of the
  codes and of the mask);
* ``uniform``: the adaptive search's uniform levels alone (level means, three rounding offsets);
* ``adaptive``: what ``ckptzip.modes.adaptive.search`` picks from both;
* ``ecsq``: ``round(r / step)`` reconstructed at the level midpoints, the step bisected to the
  error, order-0 entropy of the integers (the textbook entropy-coded uniform quantizer);
* ``ecsq_dz``: the same with a dead zone (rounding offset 0.3 instead of 0.5).

    python benchmarks/probes/quantizer_probe.py
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import torch

from ckptzip.demo.train import load_data, make_trainer
from ckptzip.modes import quantize as adaptive

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fidelity import FULL  # benchmarks/fidelity.py


def entropy_bits(values: np.ndarray) -> float:
    _, counts = np.unique(values, return_counts=True)
    return float(-(counts * np.log2(counts / counts.sum())).sum())


def uniform_bits(residual: np.ndarray, energy: float, budget: float, offset: float) -> float:
    """Bits of the coarsest uniform quantizer (rounding offset ``offset``) within ``budget``."""
    lo, hi = 1e-12, float(np.abs(residual).max()) * 4
    for _ in range(50):
        step = math.sqrt(lo * hi)
        codes = np.sign(residual) * np.floor(np.abs(residual) / step + offset)
        error = math.sqrt(float(((residual - codes * step) ** 2).sum()) / energy)
        lo, hi = (lo, step) if error > budget else (step, hi)
    return entropy_bits(np.sign(residual) * np.floor(np.abs(residual) / lo + offset))


def main() -> None:
    torch.set_num_threads(1)
    train, _ = load_data(FULL)
    trainer = make_trainer(FULL, 320, 0)
    weights = []
    for _ in range(4):
        trainer.train(train, 20)
        weights.append({k: t.clone() for k, t in trainer.state()["model"].items()})
    for budget in (0.22, 0.35, 0.5):
        bits = dict.fromkeys(("kmeans", "uniform", "adaptive", "ecsq", "ecsq_dz"), 0.0)
        count = 0
        for name, new in weights[3].items():
            residual = (new - weights[2][name]).double().reshape(-1)
            if residual.numel() < 1000:
                continue
            energy = float(residual.pow(2).sum())
            count += residual.numel()
            uniform = adaptive._uniform(residual.sort().values, energy, budget)
            bits["uniform"] += uniform.bits if uniform is not None else math.inf
            bits["adaptive"] += adaptive.search(residual.float(), energy, budget).bits
            original = adaptive._uniform
            adaptive._uniform = lambda *args: None  # the k-means family alone
            try:
                bits["kmeans"] += adaptive.search(residual.float(), energy, budget).bits
            finally:
                adaptive._uniform = original
            bits["ecsq"] += uniform_bits(residual.numpy(), energy, budget, 0.5)
            bits["ecsq_dz"] += uniform_bits(residual.numpy(), energy, budget, 0.3)
        print(f"{count:,} weights, relative error {budget}: " +
              ", ".join(f"{k} {v / count:.3f}" for k, v in bits.items()) + " bits/weight")


if __name__ == "__main__":
    main()
