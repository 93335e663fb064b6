"""Incremental (delta) checkpoints on a real training run: ckptzip against zipnn's XOR delta.

A small GPT is trained on the Python standard library's source; its full state (weights and
AdamW moments) is kept at a base step and at 10, 50 and 200 steps later. For each interval the
newer state is coded against the base:

* ckptzip delta: ``ckptzip.dumps(new, base=base)`` / ``ckptzip.loads(blob, base=base)``, which picks
  per tensor the zigzagged difference of monotone-mapped patterns (coded in buckets of the base's
  exponent or not) or dense, and for integer tensors also XOR;
* zipnn delta: zipnn 0.5.4 on ``new ^ base`` per tensor (its delta method), XOR time included;
* ckptzip dense: the same state without a base, for the speed comparison.

Every decode is checked bit for bit. Weights are measured in fp32 and cast to bf16.

    python benchmarks/incremental.py           # trains 300 steps once (cached), then measures
    python benchmarks/incremental.py --quick   # tiny model, short run: a smoke test
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import OUT_DIR, info_markdown, machine_info, thread_counts, write_results

import ckptzip
from ckptzip import peers
from ckptzip.codecs import ContextPlanes
from ckptzip.demo.datasets import default_cache_dir
from ckptzip.demo.train import CONFIGS, load_data, make_trainer

BASE_STEP, INTERVALS, TOTAL_STEPS = 100, (10, 50, 200), 300
QUICK_BASE_STEP, QUICK_INTERVALS, QUICK_TOTAL = 10, (2, 5, 10), 20


def training_states(quick: bool) -> dict[int, dict[str, Any]]:
    """Full states at the base step and at each interval after it (trained once, then cached)."""
    config = CONFIGS["tiny" if quick else "small"]
    base_step, intervals, total = (
        (QUICK_BASE_STEP, QUICK_INTERVALS, QUICK_TOTAL) if quick else (BASE_STEP, INTERVALS, TOTAL_STEPS)
    )
    wanted = [base_step, *(base_step + g for g in intervals)]
    cache = default_cache_dir() / f"incremental-{'tiny' if quick else 'small'}-{total}"
    paths = {step: cache / f"step-{step:05d}.pt" for step in wanted}
    if all(p.exists() for p in paths.values()):
        return {step: torch.load(p, weights_only=True) for step, p in paths.items()}
    cache.mkdir(parents=True, exist_ok=True)
    train, _ = load_data(config)
    trainer = make_trainer(config, total)
    states = {}
    for step in wanted:
        trainer.train(train, step - trainer.step)
        states[step] = ckptzip.loads(ckptzip.dumps(trainer.state()))  # a deep, exact copy
        torch.save(states[step], paths[step].with_suffix(".tmp"))
        os.replace(paths[step].with_suffix(".tmp"), paths[step])
        print(f"trained to step {step}", file=sys.stderr)
    return states


def weights(state: dict[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The model's tensors cast to ``dtype`` (tied weights stay one tensor)."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}
    for name, t in state["model"].items():
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen[ptr] = t.to(dtype) if t.is_floating_point() else t
        out[name] = seen[ptr]
    return out


def raw_size(state: Any) -> int:
    return sum(leaf.nbytes for leaf in ckptzip.tree.flatten(state)[1])


@dataclass
class Row:
    data: str
    interval: int
    threads: int
    tool: str
    raw_bytes: int
    stored_bytes: int
    compress_mbps: float
    decompress_mbps: float
    picks: str = ""

    @property
    def ratio(self) -> float:
        return self.raw_bytes / self.stored_bytes


def best_of(repeat: int, run: Any) -> tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return best, result


def assert_exact(expected: Any, actual: Any, what: str) -> None:
    for e, a in zip(ckptzip.tree.flatten(expected)[1], ckptzip.tree.flatten(actual)[1]):
        if not np.array_equal(e.host_bytes(), a.host_bytes()):
            raise SystemExit(f"{what}: {e.name} did not decode bit-exactly")


def measure_ckptzip(data: str, g: int, new: Any, base: Any | None, threads: int, repeat: int) -> Row:
    raw = raw_size(new)
    c_s, blob = best_of(repeat, lambda: ckptzip.dumps(new, base=base, threads=threads))
    d_s, out = best_of(repeat, lambda: ckptzip.loads(blob, base=base, threads=threads))
    assert_exact(new, out, f"ckptzip {data}")
    picks: Counter[str] = Counter()
    with ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob)) as ckpt:
        for leaf in ckpt.leaves:
            kind = leaf.pipeline.residual.kind if leaf.pipeline.residual else "dense"
            if isinstance(leaf.pipeline.serializer, ContextPlanes):
                kind += "+buckets"
            picks[kind] += leaf.nbytes
    summary = ", ".join(f"{k} {v / raw:.0%}" for k, v in picks.most_common())
    tool = "ckptzip delta" if base is not None else "ckptzip dense"
    return Row(data, g, threads, tool, raw, len(blob), raw / c_s / 1e6, raw / d_s / 1e6, summary)


def measure_zipnn_xor(data: str, g: int, new: dict[str, torch.Tensor], base: dict[str, torch.Tensor],
                      threads: int, repeat: int) -> Row | None:
    zipnn = peers.get("zipnn")
    if not zipnn.available():
        return None
    pairs = []
    for name, t in new.items():
        a = t.contiguous().reshape(-1).view(torch.uint8).numpy()
        b = base[name].contiguous().reshape(-1).view(torch.uint8).numpy()
        dtype = "bfloat16" if t.dtype == torch.bfloat16 else str(t.dtype).removeprefix("torch.")
        pairs.append((a, b, dtype))
    raw = sum(a.size for a, _, _ in pairs)

    def compress() -> list[bytes]:
        return [zipnn.compress(np.bitwise_xor(a, b), threads=threads, dtype=dt, scratch=True)
                for a, b, dt in pairs]

    c_s, blobs = best_of(repeat, compress)

    def decompress() -> list[np.ndarray]:
        return [np.bitwise_xor(zipnn.decompress(blob, a, threads=threads, dtype=dt), b)
                for blob, (a, b, dt) in zip(blobs, pairs)]

    d_s, outs = best_of(repeat, decompress)
    for out, (a, _, _) in zip(outs, pairs):
        if not np.array_equal(out.view(np.uint8).reshape(-1), a):
            raise SystemExit(f"zipnn {data}: XOR delta did not decode exactly")
    return Row(data, g, threads, "zipnn xor-delta", raw, sum(len(b) for b in blobs),
               raw / c_s / 1e6, raw / d_s / 1e6)


def run(quick: bool, threads_list: list[int], repeat: int) -> list[Row]:
    states = training_states(quick)
    steps = sorted(states)
    base_step = steps[0]
    rows: list[Row] = []
    for step in steps[1:]:
        g = step - base_step
        for threads in threads_list:
            for label, dtype in (("weights fp32", torch.float32), ("weights bf16", torch.bfloat16)):
                new, base = weights(states[step], dtype), weights(states[base_step], dtype)
                rows.append(measure_ckptzip(label, g, new, None, threads, repeat))
                rows.append(measure_ckptzip(label, g, new, base, threads, repeat))
                zipnn_row = measure_zipnn_xor(label, g, new, base, threads, repeat)
                if zipnn_row is not None:
                    rows.append(zipnn_row)
            rows.append(measure_ckptzip("full state", g, states[step], None, threads, repeat))
            rows.append(measure_ckptzip("full state", g, states[step], states[base_step], threads, repeat))
            print(f"measured interval {g} on {threads} thread(s)", file=sys.stderr)
    return rows


def markdown(rows: list[Row]) -> str:
    lines = ["| data | interval | threads | tool | ratio | vs zipnn xor | compress MB/s "
             "| decompress MB/s | speed vs dense (c / d) | bytes coded as |", "|" + "---|" * 10]
    index = {(r.data, r.interval, r.threads, r.tool): r for r in rows}
    for r in rows:
        zipnn = index.get((r.data, r.interval, r.threads, "zipnn xor-delta"))
        dense = index.get((r.data, r.interval, r.threads, "ckptzip dense"))
        vs_zipnn = f"{r.ratio / zipnn.ratio:.2f}x" if zipnn and r.tool == "ckptzip delta" else ""
        vs_dense = ""
        if dense and r.tool == "ckptzip delta":
            vs_dense = (f"{r.compress_mbps / dense.compress_mbps:.2f} / "
                        f"{r.decompress_mbps / dense.decompress_mbps:.2f}")
        lines.append(f"| {r.data} | {r.interval} | {r.threads} | {r.tool} | {r.ratio:.3f} | {vs_zipnn} | "
                     f"{r.compress_mbps:.0f} | {r.decompress_mbps:.0f} | {vs_dense} | {r.picks} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny model, short run (smoke test)")
    parser.add_argument("--threads", type=thread_counts, default=None,
                        help="e.g. 1,2 or all (default 1,all)")
    parser.add_argument("--repeat", type=int, default=None,
                        help="runs per measurement, best kept (default 3)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where to write the results")
    args = parser.parse_args()
    threads_list = args.threads or ([1] if args.quick else thread_counts("1,all"))
    repeat = args.repeat or (1 if args.quick else 3)
    info = machine_info()
    rows = run(args.quick, threads_list, repeat)
    text = "## Incremental checkpoints\n\n" + info_markdown(info) + "\n\n" + markdown(rows) + "\n"
    print(text)
    data = {"machine": info, "rows": [asdict(r) | {"ratio": r.ratio} for r in rows]}
    write_results("incremental", text, data, args.out)


if __name__ == "__main__":
    main()
