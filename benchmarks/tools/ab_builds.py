"""Two builds of ckptzip's delta chunk coder, A against B, in alternating processes.

Build-level changes (a kernel, a table policy) move the delta coder by a few percent, and the
speed of a shared VM drifts by more than that between runs. This runs the two builds in turns,
process after process, on the same chunks (the weights of benchmarks/incremental.py at its
shortest and longest interval, 10 and 200 steps, fp32 and bf16, in the policy's 256 KiB chunks)
and keeps each build's best encode and decode speed per row, with the dense coder on the shortest
interval's weights as a yardstick. It also says whether the two builds wrote the same streams.

    git worktree add /tmp/old REV
    (cd /tmp/old && python setup.py build_ext --inplace -q)
    python benchmarks/tools/ab_builds.py /tmp/old/src src [--rounds 5]
    python benchmarks/tools/ab_builds.py src src --quick --rounds 1   # tiny model: a smoke test

Each path is a directory holding an importable, built ``ckptzip`` (a checkout's ``src``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ckptzip.pipeline import Pipeline

HERE = Path(__file__).resolve().parent
#: benchmarks/, where incremental.py (the data) and common.py live.
BENCHMARKS = HERE.parent


def chunk_sets(quick: bool) -> dict[str, np.ndarray]:
    """The weights' bytes at the base step (``fp32_0``, ``bf16_0``) and at each interval on
    (``fp32_10``...), cached as one .npz."""
    from ckptzip.demo.datasets import default_cache_dir

    cache = default_cache_dir() / f"ab-builds-weights{'-tiny' if quick else ''}.npz"
    if not cache.exists():
        import torch

        sys.path.insert(0, str(BENCHMARKS))
        import incremental

        states = incremental.training_states(quick)
        steps = sorted(states)
        arrays: dict[str, Any] = {}  # not ndarray: mypy would match **arrays to savez's allow_pickle
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            arrays[f"{name}_0"] = incremental.flat_weights(states[steps[0]], dtype)
            for step in steps[1:]:
                arrays[f"{name}_{step - steps[0]}"] = incremental.flat_weights(states[step], dtype)
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, cache)
    with np.load(cache) as data:
        return {k: data[k] for k in data.files}


def rows(data: dict[str, np.ndarray]) -> list[tuple[str, int]]:
    """(dtype, interval) of the rows: the shortest and the longest interval, fp32 then bf16; then
    interval 0, the shortest interval's weights coded dense (no base), as a yardstick."""
    intervals = sorted(int(k.split("_")[1]) for k in data if k.startswith("fp32_") and k != "fp32_0")
    return [(name, g) for name in ("fp32", "bf16") for g in (intervals[0], intervals[-1], 0)]


def row_label(name: str, interval: int) -> str:
    return f"{name} dense" if interval == 0 else f"{name} {interval}"


def row_coder(data: dict[str, np.ndarray], name: str,
              interval: int) -> tuple[Pipeline, np.ndarray, np.ndarray | None]:
    """A row's pipeline, new bytes and base bytes: the bucketed float difference against the
    base's weights, or for interval 0 the dense pipeline on the shortest interval's weights (base
    None)."""
    from ckptzip.codecs import BytePlanes, ContextPlanes, Entropy, Residual
    from ckptzip.pipeline import Pipeline

    width = 4 if name == "fp32" else 2
    if interval:
        coder = Pipeline(residual=Residual("float-diff", width), serializer=ContextPlanes(width))
        return coder, data[f"{name}_{interval}"], data[f"{name}_0"]
    coder = Pipeline(serializer=BytePlanes(width, 1), compressors=(Entropy(),))
    return coder, data[f"{name}_{rows(data)[0][1]}"], None


def chunk_spans(size: int) -> list[tuple[int, int]]:
    """[start, end) of each chunk of a row's bytes, in the policy's chunk size."""
    from ckptzip.policy import DEFAULT_CHUNK_BYTES

    return [(a, min(a + DEFAULT_CHUNK_BYTES, size)) for a in range(0, size, DEFAULT_CHUNK_BYTES)]


def child(repeat: int, quick: bool) -> None:
    """One round in this process's build: a JSON line per row."""
    data = chunk_sets(quick)
    for name, interval in rows(data):
        coder, new, base = row_coder(data, name, interval)
        spans = chunk_spans(len(new))
        out = np.empty(len(new), np.uint8)
        enc = dec = float("inf")
        chunks: list[bytes] = []
        for _ in range(repeat):
            started = time.perf_counter()
            chunks = [coder.encode_chunk(new[a:b], None if base is None else base[a:b])
                      for a, b in spans]
            enc = min(enc, time.perf_counter() - started)
            started = time.perf_counter()
            for c, (a, b) in zip(chunks, spans):
                coder.decode_chunk(c, out[a:b], None if base is None else base[a:b])
            dec = min(dec, time.perf_counter() - started)
        if not np.array_equal(out, new):
            raise SystemExit(f"{row_label(name, interval)}: the chunks did not decode bit-exactly")
        digest = hashlib.sha256(b"".join(chunks)).hexdigest()[:16]
        print(json.dumps({"row": row_label(name, interval), "encode": len(new) / enc / 1e6,
                          "decode": len(new) / dec / 1e6, "bytes": sum(map(len, chunks)),
                          "digest": digest}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", nargs="?", help="directory with build A's ckptzip (e.g. /tmp/old/src)")
    parser.add_argument("b", nargs="?", help="directory with build B's ckptzip (e.g. src)")
    parser.add_argument("--rounds", type=int, default=5, help="A-then-B rounds (default 5)")
    parser.add_argument("--repeat", type=int, default=2, help="runs per round, best kept")
    parser.add_argument("--quick", action="store_true", help="tiny model, short run (smoke test)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.repeat, args.quick)
        return
    if not args.a or not args.b:
        parser.error("give the two builds' directories")
    table = rows(chunk_sets(args.quick))  # the cache made once, outside the timed rounds
    best: dict[tuple[str, str], dict[str, float]] = {}
    streams: dict[tuple[str, str], str] = {}
    for _ in range(args.rounds):
        for build, path in (("A", args.a), ("B", args.b)):
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(path).resolve()),
                                                               str(BENCHMARKS)]))
            run = subprocess.run([sys.executable, __file__, "--child", "--repeat",
                                  str(args.repeat)] + (["--quick"] if args.quick else []),
                                 env=env, capture_output=True, text=True)
            if run.returncode:
                raise SystemExit(f"build {build} ({path}) failed:\n{run.stderr}")
            for line in run.stdout.splitlines():
                r = json.loads(line)
                key = (r["row"], build)
                seen = best.setdefault(key, {"encode": 0.0, "decode": 0.0, "bytes": r["bytes"]})
                seen["encode"] = max(seen["encode"], r["encode"])
                seen["decode"] = max(seen["decode"], r["decode"])
                streams[key] = r["digest"]
    print(f"A = {args.a}, B = {args.b}; best of {args.rounds} rounds x {args.repeat}, MB/s")
    print("| row | encode A -> B | decode A -> B | bytes A -> B | streams |")
    print("|---|---|---|---|---|")
    for name, interval in table:
        row = row_label(name, interval)
        a, b = best[(row, "A")], best[(row, "B")]
        same = "same" if streams[(row, "A")] == streams[(row, "B")] else "differ"
        print(f"| {row} | {a['encode']:.0f} -> {b['encode']:.0f} ({b['encode'] / a['encode']:.2f}x)"
              f" | {a['decode']:.0f} -> {b['decode']:.0f} ({b['decode'] / a['decode']:.2f}x) | "
              f"{a['bytes']:.0f} -> {b['bytes']:.0f} | {same} |")


if __name__ == "__main__":
    main()
