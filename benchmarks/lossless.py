"""Lossless compression of real checkpoints: ckptzip against zstd, byte planes, blosc2 and zipnn.

Data sets: the pretrained all-MiniLM-L6-v2 weights (fp32, and cast to bf16), a small GPT's weights
(fp32 and bf16) after a short training run, that run's Adam moments, and its full training state.
Each is measured on one thread and on all cores, with the order-0 entropy bound beside it; loads
both warm (repeated in this process) and in a fresh process. The timing rules are
``ckptzip.benchtool``'s: copies and checks outside the clocks, peers at N threads on their own
threads or on a pool over the tensors, whichever is faster for them.

    python benchmarks/lossless.py            # trains the GPT once (~5 min, cached), then measures
    python benchmarks/lossless.py --out docs/scoreboard/raw   # the scoreboard run (make bench)
    python benchmarks/lossless.py --quick    # small data, one repeat: a smoke test
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from common import OUT_DIR, csv, info_markdown, machine_info, thread_counts, write_results

from ckptzip import benchtool
from ckptzip.demo.datasets import gpt_training_run, minilm_state_dict
from ckptzip.demo.train import CONFIGS

#: The GPT run whose last checkpoint is measured (trained once, then cached).
GPT_STEPS, GPT_SAVE_EVERY = 300, 30
QUICK_GPT_STEPS = 20
#: ``--quick`` keeps this many leading elements of each MiniLM tensor.
QUICK_ELEMENTS = 1 << 16


def cast(state: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``state`` with its floating tensors cast to ``dtype``; tied tensors stay tied."""
    done: dict[tuple[Any, ...], torch.Tensor] = {}
    out = {}
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype)
        if key not in done:
            done[key] = t.to(dtype) if t.is_floating_point() else t
        out[name] = done[key]
    return out


def minilm(dtype: torch.dtype, quick: bool) -> dict[str, torch.Tensor]:
    state = minilm_state_dict(dtype)
    if quick:
        return {name: t.reshape(-1)[:QUICK_ELEMENTS].clone() for name, t in state.items()}
    return state


def gpt_state(quick: bool) -> dict[str, Any]:
    """The full training state at the end of the GPT run (trained once, then cached)."""
    if quick:
        runs = gpt_training_run(QUICK_GPT_STEPS, QUICK_GPT_STEPS, config=CONFIGS["tiny"])
    else:
        runs = gpt_training_run(GPT_STEPS, GPT_SAVE_EVERY)
    return runs[-1][1]


def adam_moment(state: dict[str, Any], key: str) -> dict[str, torch.Tensor]:
    return {str(pid): s[key] for pid, s in state["optimizer"]["state"].items()}


def gpt_weights(state: dict[str, Any], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    return cast(state["model"], dtype)


@dataclass(frozen=True)
class DataSet:
    title: str
    load: Callable[[bool], Any]


SETS: dict[str, DataSet] = {
    "minilm-fp32": DataSet("all-MiniLM-L6-v2 weights, fp32", lambda q: minilm(torch.float32, q)),
    "minilm-bf16": DataSet("all-MiniLM-L6-v2 weights, cast to bf16", lambda q: minilm(torch.bfloat16, q)),
    "gpt-fp32": DataSet("small GPT weights, fp32", lambda q: gpt_weights(gpt_state(q), torch.float32)),
    "gpt-bf16": DataSet(
        "small GPT weights, cast to bf16", lambda q: gpt_weights(gpt_state(q), torch.bfloat16)
    ),
    "adam-exp-avg": DataSet("small GPT, Adam exp_avg (fp32)", lambda q: adam_moment(gpt_state(q), "exp_avg")),
    "adam-exp-avg-sq": DataSet(
        "small GPT, Adam exp_avg_sq (fp32)", lambda q: adam_moment(gpt_state(q), "exp_avg_sq")
    ),
    "gpt-full-state": DataSet(
        "small GPT full training state (weights, both moments, scheduler, RNG)", gpt_state
    ),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small data and 1 repeat (smoke test)")
    parser.add_argument(
        "--threads",
        type=thread_counts,
        default=thread_counts(f"1,{os.cpu_count() or 1}"),
        help="comma-separated thread counts, 'all' = every core (default: 1 and all)",
    )
    parser.add_argument("--sets", type=csv(list(SETS)), default=list(SETS), help=f"of {', '.join(SETS)}")
    parser.add_argument(
        "--tools",
        type=csv([benchtool.CKPTZIP, *benchtool.peer_registry.PEERS]),
        default=None,
        help="ckptzip and/or peers to measure (default: ckptzip and every installed peer)",
    )
    parser.add_argument("--repeat", type=int, default=None, help="timed passes (default 5, 1 with --quick)")
    parser.add_argument("--fresh-repeat", type=int, default=None,
                        help="fresh processes per tool timing one load (default 3, 1 with --quick)")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where to write lossless.md/.json")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 5
    if args.fresh_repeat is None:
        args.fresh_repeat = 1 if args.quick else 3
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    info = machine_info()
    for name, reason in info["missing_peers"].items():
        print(f"missing peer {name}: {reason}", file=sys.stderr)
    sections = []
    results = []
    for name in args.sets:
        data_set = SETS[name]
        print(f"{name}: loading", file=sys.stderr)
        state = data_set.load(args.quick)
        bound = benchtool.entropy_bound(state)
        rows = []
        for threads in args.threads:
            rows += benchtool.compare(
                state, threads=threads, repeat=args.repeat, peers=args.tools, progress=True,
                fresh_repeat=args.fresh_repeat,
            )
        title = f"**{data_set.title}** ({rows[0].raw_bytes / 1e6:.1f} MB): order-0 bound {bound:.3f}"
        table = benchtool.format_table(rows, title)
        print(table + "\n", flush=True)
        sections.append(table)
        results.append(
            {
                "set": name,
                "title": data_set.title,
                "raw_bytes": rows[0].raw_bytes,
                "entropy_bound": bound,
                "rows": [asdict(row) for row in rows],
            }
        )
    markdown = "\n\n".join(
        [
            "# Lossless benchmark"
            + (" (--quick: reduced data, not for the scoreboard)" if args.quick else ""),
            info_markdown(info),
            "Ratio = raw bytes / stored bytes. MB/s = 10^6 bytes of raw data per second, best "
            f"of {args.repeat} after a warm-up, the tools in turns; input copies and bit-exact "
            "checks outside the clocks. Fresh process: one load in a new process (imports and "
            f"reading the input not timed), best of {args.fresh_repeat}. A peer at N threads runs "
            "on its own threads tensor after tensor (own) or on a pool of N threads over the "
            "tensors (pool), whichever is faster, per direction. The bound is the order-0 "
            "entropy of rotated byte planes with one histogram per "
            f"{benchtool.BOUND_CHUNK} elements.",
            *sections,
        ]
    )
    write_results(
        "lossless",
        markdown + "\n",
        {"machine": info, "quick": args.quick, "repeat": args.repeat,
         "fresh_repeat": args.fresh_repeat, "sets": results},
        args.out,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
