"""How small can a lossless delta of these weights be? Entropy bounds of the residual against the base.

On the same cached training states as ``benchmarks/incremental.py`` (the small GPT at step 100,
and 10, 50 and 200 steps later), the weights are cast to fp32 and bf16, and the zigzagged
difference of monotone-mapped bit patterns (ckptzip's ``float-diff`` residual) is split into
byte planes. Printed per interval and dtype:

* each plane's order-0 entropy with one histogram per 65,536 elements (tables free);
* for fp32, the two low planes' entropy given the magnitude of the residual's top 16 bits (is
  there anything left to model below them?);
* the planes' entropy given the base's exponent (the context ckptzip's ``ctxplanes`` codes with)
  and given more (the top residual byte, the base's top mantissa bit);
* the ratio those bounds allow, next to 1.2x zipnn's XOR-delta ratio measured by
  ``benchmarks/incremental.py`` (the issue's target), which this script does not run;
* whether Adam's moments (the base's, or the new checkpoint's) predict the fp32 update: the bits
  of the update above its noise floor before and after a least-squares fit on them;
* the cost of coding the residual's top 16 bits as one symbol per element (with escapes) instead
  of two byte planes: half the entropy coder's steps, if the bits hold.

    python benchmarks/probes/incremental_bounds.py           # about 10 s once the states are cached
    python benchmarks/probes/incremental_bounds.py --quick   # the tiny model's short run (the tests)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from incremental import training_states, weights  # benchmarks/incremental.py

CHUNK = 65536


def entropy(counts: np.ndarray) -> float:
    counts = counts[counts > 0]
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


def chunked(symbols: np.ndarray) -> float:
    """Bits per symbol with one order-0 table per :data:`CHUNK` symbols."""
    total = 0.0
    for start in range(0, len(symbols), CHUNK):
        part = symbols[start : start + CHUNK]
        total += entropy(np.bincount(part, minlength=256)) * len(part)
    return total / max(len(symbols), 1)


def conditional(context: np.ndarray, symbols: np.ndarray) -> float:
    """H(symbols | context) in bits per symbol, one global table per context value."""
    contexts = int(context.max()) + 1
    joint = np.bincount(context * 256 + symbols, minlength=contexts * 256).reshape(contexts, 256)
    return sum(entropy(row) * row.sum() for row in joint if row.sum()) / len(symbols)


def residual(new: dict[str, torch.Tensor], base: dict[str, torch.Tensor],
             bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The zigzagged difference of monotone-mapped patterns, and the base's patterns (int64)."""
    view = torch.int32 if bits == 32 else torch.int16
    a = np.concatenate([t.reshape(-1).view(view).numpy() for t in new.values()]).astype(np.int64)
    b = np.concatenate([t.reshape(-1).view(view).numpy() for t in base.values()]).astype(np.int64)
    magnitude = (1 << (bits - 1)) - 1

    def monotone(x: np.ndarray) -> np.ndarray:
        return np.where(x < 0, -(x & magnitude), x)

    d = monotone(a) - monotone(b)
    return np.where(d >= 0, 2 * d, -2 * d - 1), b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the tiny model's short run")
    states = training_states(parser.parse_args().quick)
    steps = sorted(states)
    print("| interval | dtype | plane entropies, low to high (bits, per 64K) | low 16 bits' planes "
          "given the top 16 bits' magnitude | planes given the base's exponent | + top residual byte, base's "
          "top mantissa bit | ratio: order-0 / base exponent / best context |")
    print("|---|---|---|---|---|---|---|")
    for step in steps[1:]:
        for dtype, bits in ((torch.float32, 32), (torch.bfloat16, 16)):
            z, b = residual(weights(states[step], dtype), weights(states[steps[0]], dtype), bits)
            planes = [(z >> (8 * k)) & 0xFF for k in range(bits // 8)]
            order0 = [chunked(p) for p in planes]
            high = z >> (bits - 8)
            top16 = (z >> (bits - 16)).astype(np.float64)
            magnitude = np.floor(np.log2(top16 + 1)).astype(np.int64)
            low_given = [conditional(magnitude, p) for p in planes[:-2]]
            exponent = (b >> (bits - 9)) & 0xFF  # the base's exponent byte
            given_exponent = [conditional(exponent, p) for p in planes]
            mantissa_top = (b >> (bits - 10)) & 1
            richer = [conditional((exponent * 4 + np.minimum(high, 3)) * 2 + mantissa_top, p)
                      for p in planes[:-1]] + [given_exponent[-1]]
            ratios = [bits / sum(h) for h in (order0, given_exponent, richer)]
            name = "fp32" if bits == 32 else "bf16"
            print(f"| {step - steps[0]} | {name} | {' / '.join(f'{h:.3f}' for h in order0)} | "
                  f"{' / '.join(f'{h:.3f}' for h in low_given) or '-'} | "
                  f"{' / '.join(f'{h:.3f}' for h in given_exponent)} | "
                  f"{' / '.join(f'{h:.3f}' for h in richer)} | "
                  f"{' / '.join(f'{r:.3f}' for r in ratios)} |")

    print()
    predictions(states)
    print()
    joint_symbols(states)


def moments_by_weight(state: dict) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(weight name, exp_avg, exp_avg_sq) of each parameter: the demo GPT's optimizer numbers its
    parameters matrices first (group 0), then vectors (group 1), each in the model's order."""
    seen: set[int] = set()
    params = []
    for name, t in state["model"].items():
        if t.is_floating_point() and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            params.append((name, t))
    ordered = [p for p in params if p[1].dim() >= 2] + [p for p in params if p[1].dim() < 2]
    moments = state["optimizer"]["state"]
    out = []
    for i, (name, t) in enumerate(ordered):
        m, v = moments[i]["exp_avg"], moments[i]["exp_avg_sq"]
        if m.shape != t.shape:
            raise SystemExit(f"{name}: moment {i} has shape {tuple(m.shape)}, not {tuple(t.shape)}")
        out.append((name, m, v))
    return out


def predictions(states: dict) -> None:
    """Would Adam's moments predict the update? Per tensor, the fp32 update ``d = w - w_base``
    is fit by least squares on Adam's step direction ``m / sqrt(v)`` of the base, of the new
    checkpoint (whose moments a decoder could have first), and on both plus the base weight
    (weight decay). Printed: the mean of log2(|residual| / ulp(w)), about the bits an element's
    difference takes above its noise floor, before and after each fit."""
    steps = sorted(states)
    base = states[steps[0]]
    print("| interval | update | - base m/sqrt(v) | - new m/sqrt(v) | - both | - both, base w |")
    print("|---|---|---|---|---|---|")
    for step in steps[1:]:
        new = states[step]
        totals = np.zeros(5)
        count = 0
        for (name, m0, v0), (_, m1, v1) in zip(moments_by_weight(base), moments_by_weight(new)):
            w0 = base["model"][name].double().flatten()
            w1 = new["model"][name].double().flatten()
            d = w1 - w0
            p0 = m0.double().flatten() / (v0.double().flatten().sqrt() + 1e-8)
            p1 = m1.double().flatten() / (v1.double().flatten().sqrt() + 1e-8)
            ulp = w1.float().abs().clamp_min(1e-30).double() * 2.0**-23
            totals[0] += torch.log2((d.abs() / ulp).clamp_min(1)).sum().item()
            for k, columns in enumerate(([p0], [p1], [p0, p1], [p0, p1, w0]), start=1):
                x = torch.stack(columns, 1)
                fit = torch.linalg.lstsq(x, d[:, None]).solution.flatten()
                r = d - x @ fit
                totals[k] += torch.log2((r.abs() / ulp).clamp_min(1)).sum().item()
            count += d.numel()
        bits = totals / count
        print(f"| {step - steps[0]} | {bits[0]:.2f} | " + " | ".join(
            f"{b:.2f} ({b - bits[0]:+.2f})" for b in bits[1:]) + " |")


def chunked_given(context: np.ndarray, symbols: np.ndarray) -> float:
    """H(symbols | context) in bits per symbol, one table per context value and :data:`CHUNK`."""
    total = 0.0
    for start in range(0, len(symbols), CHUNK):
        total += conditional(context[start : start + CHUNK], symbols[start : start + CHUNK]) * len(
            symbols[start : start + CHUNK])
    return total / max(len(symbols), 1)


def joint_symbols(states: dict) -> None:
    """One coded symbol per element instead of two byte planes? The residual's top 16 bits
    (a bf16 residual, or an fp32 one's coded half) as ``min(top, 255)`` in the base exponent's
    context, with the elements at 255 (escapes) sending ``top - 255`` as two order-0 bytes: bits
    per element against the two planes coded apart, per 64K elements. One rANS step per element
    (and one more per escape) instead of two."""
    steps = sorted(states)
    print("| interval | dtype | escapes | two planes given the exponent | one symbol + escapes |")
    print("|---|---|---|---|---|")
    for step in steps[1:]:
        for dtype, bits in ((torch.bfloat16, 16), (torch.float32, 32)):
            z, b = residual(weights(states[step], dtype), weights(states[steps[0]], dtype), bits)
            top = z >> (bits - 16)
            exponent = (b >> (bits - 9)) & 0xFF
            apart = chunked_given(exponent, top & 0xFF) + chunked_given(exponent, top >> 8)
            escaped = top >= 255
            joint = chunked_given(exponent, np.minimum(top, 255))
            rest = top[escaped] - 255
            side = sum(chunked(part) * rest.size for part in (rest & 0xFF, rest >> 8)) / len(top)
            name = "fp32" if bits == 32 else "bf16"
            print(f"| {step - steps[0]} | {name} | {escaped.mean():.1%} | {apart:.3f} | "
                  f"{joint:.3f} + {side:.3f} = {joint + side:.3f} |")


if __name__ == "__main__":
    main()
