"""Where a lossy save's time goes besides its arithmetic: wall, user and system seconds of
``prepare`` (the lossy transforms) of a delta on 1 and 2 threads, glibc's malloc as the process
found it or tuned first (``--tuned``: :func:`ckptzip.tune_malloc`). The state is lossy_speed.py's
synthetic one (tensors up to 32 MB), or with ``--square N`` four N x N weights and their AdamW
moments (a 4096 x 4096 fp32 weight is 64 MB: past glibc's largest mmap threshold).

    python benchmarks/probes/malloc_scaling.py [--gb 0.3 | --square 4096] [--mode adaptive]
        [--rounds 3] [--tuned]
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
    parser.add_argument("--square", type=int, help="four N x N weights instead")
    parser.add_argument("--tuned", action="store_true", help="call ckptzip.tune_malloc() first")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.tuned:
        print("tune_malloc:", ckptzip.tune_malloc())
    first, second, params = (lossy_speed.square_states(args.square) if args.square
                        else lossy_speed.synthetic_states(args.gb))
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
                print(f"{args.mode} on {threads} threads: {12 * params / wall / 1e6:.0f} MB/s, "
                      f"wall {wall:.2f} s, user "
                      f"{after.user - before.user:.2f} s, system {after.system - before.system:.2f} s")


if __name__ == "__main__":
    main()
