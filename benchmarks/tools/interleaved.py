"""ckptzip against zipnn on one thread with the two tools' runs interleaved, best of N.

On a shared machine, load changes between the blocks of a long benchmark; running ckptzip and
zipnn alternately on the same bytes, and keeping each one's best time, compares them under the
same conditions. Ratios and MB/s (raw bytes per second) for the bf16 and fp32 weight sets and
the GPT's Adam moments (the sets of benchmarks/lossless.py; MiniLM only where its package is).
zipnn's input copies (it overwrites its input) and every bit-exact check are made off the clocks.

    python benchmarks/tools/interleaved.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

import ckptzip
from ckptzip import peers
from ckptzip.demo.datasets import gpt_training_run, minilm_state_dict
from ckptzip.errors import DependencyError
from ckptzip.tree import flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import machine_info  # benchmarks/common.py


def sets() -> dict[str, dict[str, torch.Tensor]]:
    state = gpt_training_run(300, 30, progress=False)[-1][1]
    model, moments = state["model"], state["optimizer"]["state"]
    found = {
        "GPT weights bf16": {k: v.bfloat16() for k, v in model.items()},
        "GPT weights fp32": dict(model),
        "Adam exp_avg": {str(k): s["exp_avg"] for k, s in moments.items()},
        "Adam exp_avg_sq": {str(k): s["exp_avg_sq"] for k, s in moments.items()},
    }
    try:
        found["MiniLM bf16"] = minilm_state_dict(torch.bfloat16)
        found["MiniLM fp32"] = minilm_state_dict(torch.float32)
    except DependencyError as exc:  # a machine without the weights' package: the GPT sets only
        print(f"MiniLM sets skipped: {exc}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    info = machine_info()
    print(f"load average {info['load_average']:.2f}, commit {info['commit']}, {info['date']}")
    zipnn = peers.get("zipnn")
    print("| set | ckptzip ratio | zipnn ratio | ckptzip c / d MB/s | zipnn c / d MB/s | c x | d x |")
    print("|---|---|---|---|---|---|---|")
    for name, state in sets().items():
        leaves = flatten(state)[1]
        raw = sum(leaf.nbytes for leaf in leaves)
        arrays = [(leaf.host_bytes(), leaf.dtype.name) for leaf in leaves]
        best = dict.fromkeys(("c", "d", "zc", "zd"), float("inf"))
        for _ in range(args.repeat):
            t = time.perf_counter()
            blob = ckptzip.dumps(state, threads=1)
            best["c"] = min(best["c"], time.perf_counter() - t)
            t = time.perf_counter()
            out = ckptzip.loads(blob, threads=1)
            best["d"] = min(best["d"], time.perf_counter() - t)
            scratch = [a.copy() for a, _ in arrays]  # zipnn overwrites its input: copied off the clock
            t = time.perf_counter()
            blobs = [zipnn.compress(w, threads=1, dtype=dt, scratch=True)
                     for w, (_, dt) in zip(scratch, arrays)]
            best["zc"] = min(best["zc"], time.perf_counter() - t)
            t = time.perf_counter()
            back = [zipnn.decompress(b, a, threads=1, dtype=dt) for b, (a, dt) in zip(blobs, arrays)]
            best["zd"] = min(best["zd"], time.perf_counter() - t)
            for leaf, (a, _), z in zip(flatten(out)[1], arrays, back):  # checked off the clock
                if not (np.array_equal(leaf.host_bytes(), a) and np.array_equal(z.view(np.uint8), a)):
                    raise SystemExit(f"{name}: a round trip was not exact")
        mbps = {k: raw / v / 1e6 for k, v in best.items()}
        z_ratio = raw / sum(map(len, blobs))
        print(f"| {name} | {raw / len(blob):.4f} | {z_ratio:.4f} | {mbps['c']:.0f} / {mbps['d']:.0f} | "
              f"{mbps['zc']:.0f} / {mbps['zd']:.0f} | {mbps['c'] / mbps['zc']:.2f} | "
              f"{mbps['d'] / mbps['zd']:.2f} |")


if __name__ == "__main__":
    main()
