"""The lossy modes' device path, run on the host: how much memory its transforms take above the
state, without a GPU.

A GPU's tensors take torch's ops where the host's take the native passes
(``ckptzip.hostpath``). Under ``torch_ops_only`` the host takes the device's path, so its peak
memory during ``prepare`` is that path's peak on a GPU, less what the GPU adds. The base's
copies to the device, which the host would skip (its base already is host memory), are made
here too (each group's ``GroupValues.on_device`` clones them; ``--no-base-copies`` skips them);
what it still does not see is torch's CUDA kernels' own workspaces. Each measurement runs in a
fresh process (the parent's memory does not count) with glibc returning every freed block of
64 KiB or more to the kernel at once, and a thread reads the resident set every millisecond.
That sampling misses short-lived temporaries. ``--exact`` counts instead: after every torch op
it reads malloc's bytes in use (``peak_memory.ExactPeak``), which is what a GPU's
``max_memory_allocated`` counts, to the op (one thread; ``--where`` names the op and frames at
the peak). On the square state of side 4096 it gave 1.13x for adaptive's torch path where
an H200 measured 1.25x (session 26, the same tree).

    python benchmarks/probes/device_memory.py [--gb 0.25 | --square 4096] [--threads 1,16]
        [--modes excp,bitsnap,adaptive] [--path torch,native] [--no-base-copies]
        [--exact [--where]]

``--square SIDE``: lossy_speed.py's square state (four SIDE x SIDE weights and their moments, each
weight group a quarter of the state) in place of its synthetic one.

Prints per mode, path and thread count: the state's bytes, the peak resident set above the
process's before ``prepare`` (the state, the keyframe's decoded tensors and torch loaded), and
that over the state's bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from peak_memory import ExactPeak, PeakWatcher, peak_cells, run_child

HERE = Path(__file__).resolve()


def child(spec: dict) -> dict:
    sys.path.insert(0, str(HERE.parents[1]))
    import lossy_speed
    import torch

    import ckptzip
    from ckptzip.hostpath import torch_ops_only
    from ckptzip.planning import prepare
    from ckptzip.reader import open_base
    from ckptzip.tree import flatten

    torch.set_num_threads(1)
    first, second, _ = (lossy_speed.square_states(spec["square"]) if spec["square"]
                        else lossy_speed.synthetic_states(spec["gb"]))
    keyframe = Path(spec["dir"]) / "key.ckz"
    if not keyframe.exists():
        ckptzip.save(first, keyframe, threads=2)
    del first
    state_bytes = sum(leaf.nbytes for leaf in flatten(second)[1])
    base = open_base(keyframe, threads=spec["threads"])
    assert base is not None
    names = [leaf.name for leaf in flatten(second)[1] if base.tensor(leaf.name) is not None]
    base.prefetch(names)
    for name in names:
        base.raw(name)
    if spec["path"] == "torch" and spec["base_copies"]:
        from ckptzip.modes.common import GroupValues

        def on_device(self: GroupValues) -> GroupValues:  # what a GPU's copy takes
            return dataclasses.replace(
                self, w_base=None if self.w_base is None else self.w_base.clone(),
                v_base=None if self.v_base is None else self.v_base.clone())

        GroupValues.on_device = on_device  # type: ignore[method-assign]
    with ExactPeak() if spec["exact"] else PeakWatcher() as watch:
        if spec["path"] == "torch":
            with torch_ops_only():
                prepared = prepare(second, mode=spec["mode"], base=base, resumed=True,
                                   threads=spec["threads"])
        else:
            prepared = prepare(second, mode=spec["mode"], base=base, resumed=True,
                               threads=spec["threads"])
    del prepared
    base.close()
    return {"state_bytes": state_bytes, "peak_extra": watch.extra, "seconds": watch.seconds,
            "where": getattr(watch, "where", "")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=0.25)
    parser.add_argument("--square", type=int, default=0)
    parser.add_argument("--threads", default="1,16")
    parser.add_argument("--modes", default="excp,bitsnap,adaptive")
    parser.add_argument("--path", default="torch,native")
    parser.add_argument("--no-base-copies", action="store_true",
                        help="torch's path without the base's copies a GPU makes")
    parser.add_argument("--exact", action="store_true",
                        help="count malloc's bytes in use after every torch op (one thread: "
                        "the threads asked are taken as 1) in place of sampling the resident "
                        "set: the peak to the op, as a GPU's allocator counts it")
    parser.add_argument("--where", action="store_true", help="with --exact: print the op and "
                        "the frames at each peak")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    print("| mode | path | threads | state MB | peak extra MB | / state | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|")
    counts = [1] if args.exact else [int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory() as work:
        for mode in args.modes.split(","):
            for path in args.path.split(","):
                for threads in counts:
                    spec = {"gb": args.gb, "square": args.square, "dir": work, "mode": mode,
                            "path": path, "threads": threads,
                            "base_copies": not args.no_base_copies, "exact": args.exact}
                    result = run_child(HERE, spec)
                    print(f"| {mode} | {path} | {threads} | {peak_cells(result)} | "
                          f"{result['seconds']:.1f} |", flush=True)
                    if args.where:
                        print(f"  peak at {result['where']}", flush=True)


if __name__ == "__main__":
    main()
