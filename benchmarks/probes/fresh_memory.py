"""What a load into fresh memory costs on this machine: the rate at which the process can fault
in memory it has never touched, beside ckptzip's loads of one lossless file into fresh and into
reused memory.

A load writes every byte of the state into new tensors. On a virtual machine, memory the guest
has given back to the host (or never used) is backed again page by page at the first touch, and
that can cost more than decoding the bytes. This probe measures, in one fresh process each:

* ``fault-in``: 1 GiB of ``_native.PageBuffer`` (the memory ckptzip decodes into: 2 MiB huge
  pages advised) in 64 MiB pieces, one byte written per 4 KiB page, then freed; three rounds
  (the first touches memory the process never had, the later ones what the kernel hands back
  after the frees);
* ``load``: the lossless keyframe of ``lossy_speed.py``'s synthetic state (``--gb``), loaded on
  one thread three times (each load's tensors are freed before the next).

    python benchmarks/probes/fresh_memory.py [--gb 1.0] [--rounds 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PIECE = 64 << 20
GIB = 1 << 30


def fault_in(rounds: int) -> list[float]:
    """GB/s of first writes into fresh PageBuffers, 1 GiB a round."""
    from ckptzip import _native
    rates = []
    for _ in range(rounds):
        start = time.perf_counter()
        buffers = []
        for _ in range(GIB // PIECE):
            buffer = _native.PageBuffer(PIECE)
            # numpy's stubs take any buffer only from Python 3.12 on (collections.abc.Buffer)
            np.frombuffer(buffer, dtype=np.uint8)[::4096] = 1  # type: ignore[call-overload]
            buffers.append(buffer)
        rates.append(GIB / (time.perf_counter() - start) / 1e9)
        del buffers
    return rates


def loads(gigabytes: float, rounds: int) -> tuple[list[float], int]:
    """MB/s of one-thread loads of the synthetic state's lossless keyframe (raw fp32 bytes of the
    full state per second), and the raw bytes."""
    import torch

    import ckptzip
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from lossy_speed import synthetic_states
    torch.set_num_threads(1)
    state, _, params = synthetic_states(gigabytes)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "key.ckz"
        ckptzip.save(state, path, threads=1)
        del state
        ckptzip.load(path, threads=1)  # the page cache holds the file: the loads read memory
        rates = []
        for _ in range(rounds):
            start = time.perf_counter()
            loaded = ckptzip.load(path, threads=1)
            rates.append(12 * params / (time.perf_counter() - start) / 1e6)
            del loaded
    return rates, 12 * params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--part", choices=("fault-in", "load"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "fault-in":
        print("fault-in GB/s, 1 GiB a round:", ", ".join(f"{r:.2f}" for r in fault_in(args.rounds)))
        return
    if args.part == "load":
        rates, raw = loads(args.gb, args.rounds)
        print(f"lossless load MB/s, {raw / 1e9:.2f} GB raw, 1 thread, in turn:",
              ", ".join(f"{r:.0f}" for r in rates))
        return
    for part in ("fault-in", "load"):  # each in a process of its own: fresh memory
        subprocess.run([sys.executable, __file__, "--part", part, "--gb", str(args.gb),
                        "--rounds", str(args.rounds)], check=True)


if __name__ == "__main__":
    main()
