"""Where a chunk coder's time goes, per element: one row's chunks coded in a loop, under perf.

The speed tables say how fast the delta coder runs against the dense one; this says where the
time goes inside each. It codes one row of ``benchmarks/tools/ab_builds.py``'s data (the GPT weights
of ``benchmarks/incremental.py`` in the policy's 256 KiB chunks: ``bf16 10`` is the bf16 weights
10 steps after the base coded against it, ``bf16 0`` the same weights coded dense) in a loop for
a few seconds, and, with ``--perf``, records only the loop (``perf record`` started disabled and
enabled through a control fifo, so the data loading and, for decoding, the first encode are not
in the profile) and prints each native function's share of the loop and its time per element.

    python benchmarks/tools/profile_chunks.py bf16 10 --op decode --perf
    python benchmarks/tools/profile_chunks.py bf16 0 --op decode --perf     # the dense yardstick
    python benchmarks/tools/profile_chunks.py bf16 10 --op encode --quick   # tiny model, no perf

Needs ``perf`` (linux-tools) for ``--perf``; the time per element of a function is its share of
the loop's samples times the loop's time per element (the process runs on one thread).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import ab_builds  # noqa: E402  (beside this script)

#: A perf report line: "  45.85%  [.] rans32_avx2_tab".
REPORT_LINE = re.compile(r"^\s*([0-9.]+)%\s+\[(.)\]\s+(\S+)")
#: Bytes per element of each row's dtype.
WIDTH = {"fp32": 4, "bf16": 2}


def run_loop(name: str, interval: int, op: str, seconds: float, quick: bool,
             control: str | None) -> tuple[int, float]:
    """Codes the row's chunks until ``seconds`` have passed; returns (elements, seconds)."""
    data = ab_builds.chunk_sets(quick)
    if interval and f"{name}_{interval}" not in data:
        intervals = sorted(int(k.split("_")[1]) for k in data if k.startswith(f"{name}_"))
        raise SystemExit(f"no {name} weights {interval} steps on; have {intervals[1:]}")
    coder, new, base = ab_builds.row_coder(data, name, interval)
    spans = ab_builds.chunk_spans(len(new))
    bases = [None if base is None else base[a:b] for a, b in spans]
    chunks = [coder.encode_chunk(new[a:b], ab) for (a, b), ab in zip(spans, bases)]
    out = np.empty(len(new), np.uint8)
    fifo = open(control, "w") if control else None  # noqa: SIM115  (held across the loop)
    if fifo:
        fifo.write("enable\n")
        fifo.flush()
    started, passes = time.perf_counter(), 0
    while passes == 0 or time.perf_counter() - started < seconds:
        if op == "encode":
            for (a, b), ab in zip(spans, bases):
                coder.encode_chunk(new[a:b], ab)
        else:
            for c, (a, b), ab in zip(chunks, spans, bases):
                coder.decode_chunk(c, out[a:b], ab)
        passes += 1
    elapsed = time.perf_counter() - started
    if fifo:
        fifo.write("disable\n")
        fifo.close()
    if op == "decode" and not np.array_equal(out, new):
        raise SystemExit(f"{name} {interval}: the chunks did not decode bit-exactly")
    return passes * len(new) // WIDTH[name], elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dtype", choices=tuple(WIDTH))
    parser.add_argument("interval", type=int, help="steps after the base; 0: dense, no base")
    parser.add_argument("--op", choices=("encode", "decode"), default="decode")
    parser.add_argument("--seconds", type=float, default=10.0, help="loop length (default 10)")
    parser.add_argument("--perf", action="store_true", help="profile the loop with perf record")
    parser.add_argument("--top", type=int, default=12, help="functions listed (default 12)")
    parser.add_argument("--quick", action="store_true", help="tiny model (smoke test)")
    parser.add_argument("--control", help=argparse.SUPPRESS)  # perf's control fifo (child)
    args = parser.parse_args()
    if not args.perf:
        elements, elapsed = run_loop(args.dtype, args.interval, args.op, args.seconds,
                                     args.quick, args.control)
        width = WIDTH[args.dtype]
        print(f"{args.dtype} {args.interval} {args.op}: {elements * width / elapsed / 1e6:.0f} "
              f"MB/s, {elapsed / elements * 1e9:.3f} ns per element")
        return
    if not shutil.which("perf"):
        raise SystemExit("--perf needs perf on the PATH (Debian: apt-get install linux-perf)")
    ab_builds.chunk_sets(args.quick)  # the cache made before the profiled child starts
    with tempfile.TemporaryDirectory() as tmp:
        fifo, data = os.path.join(tmp, "ctl"), os.path.join(tmp, "perf.data")
        os.mkfifo(fifo)
        child = [sys.executable, __file__, args.dtype, str(args.interval), "--op", args.op,
                 "--seconds", str(args.seconds), "--control", fifo]
        if args.quick:
            child.append("--quick")
        run = subprocess.run(["perf", "record", "-q", "-D", "-1", f"--control=fifo:{fifo}",
                              "-o", data, "--", *child], capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"perf record failed ({run.returncode}):\n{run.stderr}")
        print(run.stdout.strip())
        ns = float(run.stdout.split(",")[-1].split()[0])
        report = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort",
                                 "symbol", "--stdio"], capture_output=True, text=True)
        if report.returncode:
            raise SystemExit(f"perf report failed:\n{report.stderr}")
    print("| function | share of the loop | ns per element |")
    print("|---|---|---|")
    listed = 0
    for line in report.stdout.splitlines():
        match = REPORT_LINE.match(line)
        if match and listed < args.top:
            share = float(match.group(1))
            print(f"| {match.group(3)}{' (kernel)' if match.group(2) == 'k' else ''} | "
                  f"{share:.1f}% | {share / 100 * ns:.3f} |")
            listed += 1


if __name__ == "__main__":
    main()
