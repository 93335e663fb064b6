"""Where a lossy mode's device transforms spend their time (a CUDA host): torch's profiler over
one ``prepare`` of lossy_speed.py's synthetic state on the GPU against its lossless keyframe
(the keyframe's tensors decoded ahead), after one warm-up. Prints, per mode, the wall time and
the operators with the most self CPU time and the most device time.

    python benchmarks/probes/device_profile.py [--gb 0.5] [--modes adaptive,excp,bitsnap]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import lossy_speed

import ckptzip
from ckptzip.planning import prepare
from ckptzip.reader import open_base
from ckptzip.tree import flatten


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=0.5)
    parser.add_argument("--modes", default="adaptive,excp,bitsnap")
    parser.add_argument("--rows", type=int, default=18)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("this probe profiles the device path: it needs a CUDA device")
    first, second, params = lossy_speed.synthetic_states(args.gb)
    with tempfile.TemporaryDirectory() as work:
        keyframe = Path(work) / "keyframe.ckz"
        ckptzip.save(first, keyframe)
        state = lossy_speed.on_device(second, "cuda")
        for mode in args.modes.split(","):
            base = open_base(keyframe)
            assert base is not None
            names = [leaf.name for leaf in flatten(state)[1] if base.tensor(leaf.name) is not None]
            base.prefetch(names)
            for name in names:
                base.raw(name)
            prepare(state, mode=mode, base=base, resumed=True)  # warm-up
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                started = time.perf_counter()
                prepare(state, mode=mode, base=base, resumed=True)
                torch.cuda.synchronize()
                seconds = time.perf_counter() - started
            base.close()
            print(f"\n=== {mode}: {12 * params / 1e9:.2f} GB state, {seconds:.3f} s under the "
                  f"profiler ({12 * params / seconds / 1e9:.2f} GB/s)")
            averages = prof.key_averages()
            print(averages.table(sort_by="self_cpu_time_total", row_limit=args.rows,
                                 max_name_column_width=48))
            for key in ("self_device_time_total", "self_cuda_time_total"):  # torch's names
                try:
                    print(averages.table(sort_by=key, row_limit=args.rows // 2,
                                         max_name_column_width=48))
                    break
                except (AttributeError, KeyError, ValueError):
                    continue


if __name__ == "__main__":
    main()
