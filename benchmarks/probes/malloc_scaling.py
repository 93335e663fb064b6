"""Where a lossy save's second thread goes: wall, user and system seconds of ``prepare`` (the
lossy transforms) of lossy_speed.py's synthetic delta on 1 and 2 threads, glibc's malloc as the
process found it or tuned first (``--tuned``: :func:`ckptzip.tune_malloc`).

    python benchmarks/probes/malloc_scaling.py [--gb 0.3] [--mode adaptive] [--rounds 3] [--tuned]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lossy_speed

import ckptzip
from ckptzip.planning import prepare
from ckptzip.reader import open_base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=0.3)
    parser.add_argument("--mode", default="adaptive")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tuned", action="store_true", help="call ckptzip.tune_malloc() first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.tuned:
        print("tune_malloc:", ckptzip.tune_malloc())
    first, second, _ = lossy_speed.synthetic_states(args.gb)
    with tempfile.TemporaryDirectory() as work:
        keyframe = Path(work) / "keyframe.ckz"
        ckptzip.save(first, keyframe)
        for _ in range(args.rounds):
            for threads in (1, 2):
                base = open_base(keyframe, threads=threads)
                before, started = os.times(), time.perf_counter()
                prepare(second, mode=args.mode, base=base, resumed=True, threads=threads)
                wall, after = time.perf_counter() - started, os.times()
                if base is not None:
                    base.close()
                print(f"{args.mode} on {threads} threads: wall {wall:.2f} s, user "
                      f"{after.user - before.user:.2f} s, system {after.system - before.system:.2f} s")


if __name__ == "__main__":
    main()
