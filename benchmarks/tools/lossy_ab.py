"""One side of an interleaved A/B of the lossy path's speed: run it under each build's
``PYTHONPATH`` in turn, so that two commits are timed in one run on the same bytes.

    for round in 1 2; do for tree in /tmp/old/src src; do
        PYTHONPATH=$tree python benchmarks/tools/lossy_ab.py save --gigabytes 0.3
        PYTHONPATH=$tree python benchmarks/tools/lossy_ab.py load --file /tmp/ab/b-adaptive.ckz
    done; done

``save``: the synthetic state of ``benchmarks/lossy_speed.py`` (``--gigabytes``), a lossless
keyframe, then the best of two adaptive deltas against it, 1 thread. ``load``: the best of two
loads of ``--file`` (its base beside it), 1 thread, after one that warms the page cache. Prints
the raw fp32 state's MB per second of wall time and of CPU time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lossy_speed import synthetic_states

import ckptzip
from ckptzip.tree import flatten


def timed(action: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    action()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("save", "load"))
    parser.add_argument("--gigabytes", type=float, default=0.3)
    parser.add_argument("--file", type=Path)
    parser.add_argument("--out", type=Path, default=Path("/tmp/ab"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.what == "save":
        base, state, params = synthetic_states(args.gigabytes)
        args.out.mkdir(parents=True, exist_ok=True)
        keyframe, delta = args.out / "a.ckz", args.out / "b-adaptive.ckz"
        ckptzip.save(base, keyframe, mode="lossless", threads=1)
        times = [timed(lambda: ckptzip.save(state, delta, mode="adaptive", base=keyframe,
                                            resumed=True, threads=1)) for _ in range(2)]
        raw = 12 * params
    else:
        if args.file is None:
            parser.error("load needs --file")
        _, leaves = flatten(ckptzip.load(args.file, threads=1))
        raw = sum(leaf.tensor.numel() * leaf.tensor.element_size() for leaf in leaves
                  if torch.is_tensor(leaf.tensor) and leaf.tensor.is_floating_point())
        times = [timed(lambda: ckptzip.load(args.file, threads=1)) for _ in range(2)]
    print(f"{args.what}: {raw / min(t[0] for t in times) / 1e6:.1f} MB/s, "
          f"{raw / min(t[1] for t in times) / 1e6:.1f} MB/CPU-s")


if __name__ == "__main__":
    main()
