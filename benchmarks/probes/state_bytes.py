"""Where an adaptive delta's bytes go: stored bits per parameter by state, per fidelity setup.

For each setup named, at seed 0: the fidelity matrix's keyframe (``benchmarks/fidelity.py``
builds it, or reuses it from ``--work``), ``every`` training steps, then one adaptive delta
against the keyframe (``resumed=True``, as the matrix saves them) at the library's defaults and
at each ``--budget`` scale of session 15's budget. Printed: the bits per trained parameter of the
weights (their added factor and mask leaves included), of ``exp_avg``, of ``exp_avg_sq``, of
everything else, and the full-state ratio of that delta: what limits the ratio where it stops.
Then how much of ``exp_avg``'s energy is left after subtracting its best per-tensor multiple of
the base's ``exp_avg``, and ``beta1^every`` times it: what coding it against the base could save.

    python benchmarks/probes/state_bytes.py --work /tmp/fid --setups minilm-full,gpt10m-adamw
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fidelity import SETUPS, adaptive_budget, keyframe

import ckptzip

STATES = ("weight", "exp_avg", "exp_avg_sq", "other")


def state_of(name: str, weights: set[str]) -> str:
    base = name.split(":", 1)[0]  # an added leaf (factors, change mask) counts for its weight
    if base in weights:
        return "weight"
    last = base.rsplit(".", 1)[-1]
    return last if last in ("exp_avg", "exp_avg_sq") else "other"


def breakdown(path: Path, weights: set[str], params: int) -> dict[str, float]:
    bits = dict.fromkeys(STATES, 0.0)
    with ckptzip.open(path) as checkpoint:
        for leaf in checkpoint.leaves:
            bits[state_of(leaf.name, weights)] += 8 * leaf.stored_bytes / params
    return bits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="the matrix's keyframes")
    parser.add_argument("--setups", default="minilm-full,gpt10m-adamw")
    parser.add_argument("--budget", default="0.5,1,1.5",
                        help="scales of session 15's budget to try beside the defaults")
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    trials: list[tuple[str, dict[str, Any]]] = [("defaults", {})] + [
        (f"x{scale:g}, ratio", {"error_budget": adaptive_budget(scale)})
        for scale in map(float, args.budget.split(","))]
    predictions: list[str] = []
    print("| setup | budget | weights | exp_avg | exp_avg_sq | other | total bits/param | "
          "full-state ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in args.setups.split(","):
        setup = SETUPS[name]
        key = keyframe(setup, 0, args.work)
        task = setup.build(0, setup.total)
        task.restore(ckptzip.load(key.path))
        task.train(setup.every)
        state = task.state()
        weights = {f"model.{n}" for n in task.param_names()}
        params = sum(p.numel() for p in task.model.parameters() if p.requires_grad)
        for label, options in trials:
            with tempfile.TemporaryDirectory() as scratch:
                path = Path(scratch) / "delta.ckz"
                report = ckptzip.save(state, path, mode="adaptive", base=key.path, resumed=True,
                                      pairing=task.pairing(), **options)
                bits = breakdown(path, weights, params)
            print(f"| {name} | {label} | " + " | ".join(f"{bits[s]:.3f}" for s in STATES)
                  + f" | {sum(bits.values()):.3f} | {key.raw_bytes / report.stored_bytes:.1f}x |")
        left = momentum_left(ckptzip.load(key.path), state, setup.every)
        predictions.append(f"| {name} | {setup.every} | "
                           + " | ".join(f"{100 * part:.0f}%" for part in left) + " |")
    print("\n| setup | steps | exp_avg energy left after its best multiple of the base's | "
          "after beta1^steps times it |")
    print("|---|---:|---:|---:|")
    print("\n".join(predictions))


def momentum_left(base: dict, state: dict, steps: int, beta1: float = 0.9) -> tuple[float, float]:
    """The energy of ``exp_avg`` left after subtracting, per tensor, its least-squares multiple of
    the base's ``exp_avg``, and after subtracting ``beta1**steps`` times it (fractions of all)."""
    total = fitted = decayed = 0.0
    for index, moments in state["optimizer"]["state"].items():
        m, m_base = moments["exp_avg"].double(), base["optimizer"]["state"][index]["exp_avg"].double()
        total += float(m.pow(2).sum())
        scale = float((m * m_base).sum()) / max(float(m_base.pow(2).sum()), 1e-300)
        fitted += float((m - scale * m_base).pow(2).sum())
        decayed += float((m - beta1**steps * m_base).pow(2).sum())
    return fitted / total, decayed / total


if __name__ == "__main__":
    main()
