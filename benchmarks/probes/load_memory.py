"""How much memory a delta checkpoint's load, or its save, takes beside the state, per mode.

A delta's load decodes its base's tensors too, and so does its save against a base file. This
saves ``lossy_speed.py``'s synthetic state (``--gb``) as a lossless keyframe and, after two more
steps, as a delta of each mode against it (made once, in a first child process, which also keeps
the second state in a torch file), then loads each delta (``--save``: saves the second state as
each mode's delta against the keyframe file) in a fresh process (the parent's memory does not
count), glibc returning every freed block of 64 KiB or more to the kernel at once, while a
thread reads the resident set every millisecond.

    python benchmarks/probes/load_memory.py [--gb 1.0] [--modes lossless,excp,bitsnap,adaptive]
        [--threads 1,2] [--src DIR,DIR ...] [--save]

``--src``: builds of ckptzip to run, in turn, mode by mode (the files are made by the first); by
default the one this script imports.

Prints per build, mode and thread count: the state's bytes, the peak resident set above the
process's before the load or save (torch and ckptzip imported; for a save, the state read too)
less, for a load, the loaded state's own bytes (what it needs beside what it returns), that over
the state's bytes, and the seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from peak_memory import PeakWatcher, peak_cells, run_child

HERE = Path(__file__).resolve()


def make(spec: dict) -> dict:
    """The keyframe and one delta per mode, in ``spec["dir"]``."""
    sys.path.insert(0, str(HERE.parents[1]))
    import lossy_speed
    import torch

    import ckptzip

    first, second, _ = lossy_speed.synthetic_states(spec["gb"])
    keyframe = Path(spec["dir"]) / "key.ckz"
    ckptzip.save(first, keyframe)
    torch.save(second, Path(spec["dir"]) / "second.pt")
    for mode in spec["modes"]:
        ckptzip.save(second, Path(spec["dir"]) / f"{mode}.ckz", mode=mode, base=keyframe,
                     resumed=True)
    return {}


def load(spec: dict) -> dict:
    """One load of ``spec["mode"]``'s delta (or with ``spec["save"]``, one save of it): its peak
    resident set above the start."""
    import torch

    import ckptzip
    from ckptzip.tree import flatten

    torch.set_num_threads(spec["threads"])
    work = Path(spec["dir"])
    second = torch.load(work / "second.pt", weights_only=True) if spec["save"] else None
    with PeakWatcher() as watch:
        if second is not None:
            ckptzip.save(second, work / f"{spec['mode']}-again.ckz", mode=spec["mode"],
                         base=work / "key.ckz", resumed=True, threads=spec["threads"])
            state = second
        else:
            state = ckptzip.load(work / f"{spec['mode']}.ckz", threads=spec["threads"])
    state_bytes = sum(leaf.nbytes for leaf in flatten(state)[1])
    returned = 0 if second is not None else state_bytes
    return {"state_bytes": state_bytes, "peak_extra": watch.extra - returned,
            "seconds": watch.seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--modes", default="lossless,excp,bitsnap,adaptive")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--src", help="comma-separated builds' src directories (default: this "
                        "script's ckptzip)")
    parser.add_argument("--save", action="store_true", help="time and measure the delta's save "
                        "against the keyframe file, not its load")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(make(spec) if spec["make"] else load(spec)))
        return
    builds = args.src.split(",") if args.src else [None]
    modes = args.modes.split(",")

    print("| build | mode | threads | state MB | peak extra MB | / state | seconds |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        run_child(HERE, {"make": True, "gb": args.gb, "dir": work, "modes": modes}, builds[0])
        for mode in modes:
            for threads in (int(t) for t in args.threads.split(",")):
                for src in builds:
                    result = run_child(HERE, {"make": False, "dir": work, "mode": mode,
                                              "threads": threads, "save": args.save}, src)
                    print(f"| {src or 'this'} | {mode} | {threads} | {peak_cells(result)} | "
                          f"{result['seconds']:.2f} |", flush=True)


if __name__ == "__main__":
    main()
