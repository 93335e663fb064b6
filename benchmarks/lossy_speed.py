"""How fast the lossy modes save and load, beside the lossless path, on one thread and on all.

Two states, each a lossless keyframe and then a delta checkpoint against it (the delta is what is
timed; a lossy mode's first checkpoint is lossless anyway):

* ``demo``: the demo's GPT (10.8M parameters, AdamW), trained on its corpus; the keyframe after
  ``--demo-steps`` steps, the delta after ``--demo-delta`` more;
* ``synthetic``: a GPT-shaped state of at least ``--synthetic-gb`` of raw fp32 weights plus both
  Adam moments, stepped by AdamW with synthetic gradients (a low-rank part plus noise, as real
  updates between checkpoints are close to low rank).

Per state, mode and thread count: save and load MB/s, where MB is the raw fp32 bytes of the full
state (weights and both moments, 12 bytes a parameter), and the ratio of those bytes to the stored
ones. Runs interleave the modes (``--repeat`` rounds); the table gives each figure's range over
the rounds. The save clock covers ``ckptzip.save`` only (the input is ready in memory, the base is
a file on disk as in training); the load clock covers ``ckptzip.load`` into fresh tensors. The
bit-exact and error checks are outside both.

``--before FILE``: a JSON this script wrote earlier (say at the commit before a change): its
ratios go beside the new ones.

    python benchmarks/lossy_speed.py [--states demo,synthetic] [--synthetic-gb 1.0]
        [--threads 1,2] [--modes lossless,excp,bitsnap,adaptive] [--repeat 2] [--before FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT_DIR, csv, info_markdown, machine_info, thread_counts, write_results

import ckptzip
from ckptzip.demo.train import CONFIGS, load_data, make_trainer

MODES = ("lossless", "excp", "bitsnap", "adaptive")
STATES = ("demo", "synthetic")
#: The synthetic state's shape: a GPT block of width W holds 12 W^2 weights (attention 4 W^2,
#: MLP 8 W^2), plus biases and norms; the vocabulary's embedding is tied.
SYNTHETIC_WIDTH = 1024
SYNTHETIC_VOCAB = 8192
#: Rank of the synthetic gradients' structured part, and the noise's share of their RMS.
GRADIENT_RANK = 8
GRADIENT_NOISE = 0.3


def demo_states(steps: int, delta_steps: int) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The demo GPT's full state after ``steps`` steps and after ``delta_steps`` more (deep
    copies), and its parameter count."""
    import copy

    config = CONFIGS["small"]
    trainer = make_trainer(config, 1000, seed=0)
    train, _ = load_data(config)
    trainer.train(train, steps)
    first = copy.deepcopy(trainer.state())
    trainer.train(train, delta_steps)
    second = copy.deepcopy(trainer.state())
    return first, second, trainer.model.num_parameters()


def synthetic_states(gigabytes: float, seed: int = 0) -> tuple[dict[str, Any], dict[str, Any], int]:
    """A GPT-shaped state of at least ``gigabytes`` of fp32 weights and Adam moments, after 3
    AdamW steps and after 2 more, with gradients that are a random rank-``GRADIENT_RANK``
    product plus noise."""
    import copy

    generator = torch.Generator().manual_seed(seed)
    width = SYNTHETIC_WIDTH
    per_layer = 12 * width * width
    layers = max(1, -(-int(gigabytes * 1e9 / 12 - SYNTHETIC_VOCAB * width) // per_layer))
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (SYNTHETIC_VOCAB, width)}
    for i in range(layers):
        shapes.update({
            f"h.{i}.ln_1.weight": (width,), f"h.{i}.attn.c_attn.weight": (3 * width, width),
            f"h.{i}.attn.c_attn.bias": (3 * width,), f"h.{i}.attn.c_proj.weight": (width, width),
            f"h.{i}.ln_2.weight": (width,), f"h.{i}.mlp.c_fc.weight": (4 * width, width),
            f"h.{i}.mlp.c_fc.bias": (4 * width,), f"h.{i}.mlp.c_proj.weight": (width, 4 * width),
        })
    params = {}
    for name, shape in shapes.items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight"):
            params[name] = torch.nn.Parameter(torch.ones(shape))
        else:
            params[name] = torch.nn.Parameter(0.02 * torch.randn(shape, generator=generator))
    optimizer = torch.optim.AdamW(list(params.values()), lr=3e-4, weight_decay=0.1)

    def step() -> None:
        for p in params.values():
            if p.dim() == 2:
                left = torch.randn(p.shape[0], GRADIENT_RANK, generator=generator)
                right = torch.randn(GRADIENT_RANK, p.shape[1], generator=generator)
                grad = left @ right / GRADIENT_RANK ** 0.5
            else:
                grad = torch.randn(p.shape, generator=generator)
            grad += GRADIENT_NOISE * torch.randn(p.shape, generator=generator)
            p.grad = 1e-3 * grad
        optimizer.step()

    def state() -> dict[str, Any]:
        return copy.deepcopy({"model": {k: v.detach() for k, v in params.items()},
                              "optimizer": optimizer.state_dict()})

    for _ in range(3):
        step()
    first = state()
    for _ in range(2):
        step()
    return first, state(), sum(p.numel() for p in params.values())


def timed(run: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = run(*args, **kwargs)
    return time.perf_counter() - started, result


def measure(name: str, first: dict[str, Any], second: dict[str, Any], params: int,
            modes: list[str], threads: list[int], repeat: int, workdir: Path) -> list[dict[str, Any]]:
    """Each (mode, threads)'s save and load seconds over ``repeat`` interleaved rounds."""
    raw = 12 * params
    keyframe = workdir / f"{name}-keyframe.ckz"
    ckptzip.save(first, keyframe, mode="lossless")
    rows: dict[tuple[str, int], dict[str, Any]] = {
        (m, t): {"state": name, "mode": m, "threads": t, "params": params, "raw_bytes": raw,
                 "save_s": [], "load_s": []} for m in modes for t in threads}
    for round_ in range(repeat):
        for count in threads:
            torch.set_num_threads(count)
            for mode in modes:
                row = rows[(mode, count)]
                path = workdir / f"{name}-{mode}-{count}.ckz"
                seconds, report = timed(ckptzip.save, second, path, mode=mode, base=keyframe,
                                        resumed=True, threads=count)
                row["save_s"].append(seconds)
                row["stored_bytes"] = report.stored_bytes
                seconds, _ = timed(ckptzip.load, path, threads=count)
                row["load_s"].append(seconds)
                print(f"{name} round {round_ + 1}: {mode:>8} x{count}: save "
                      f"{raw / row['save_s'][-1] / 1e6:7.1f} MB/s, load "
                      f"{raw / row['load_s'][-1] / 1e6:7.1f} MB/s, ratio "
                      f"{raw / report.stored_bytes:.1f}x", file=sys.stderr, flush=True)
                path.unlink()
    return list(rows.values())


def speed_range(raw: int, seconds: list[float]) -> str:
    rates = sorted(raw / s / 1e6 for s in seconds)
    if len(rates) == 1 or rates[-1] < rates[0] * 1.005:
        return f"{statistics.median(rates):,.1f}"
    return f"{rates[0]:,.1f}-{rates[-1]:,.1f}"


def markdown(rows: list[dict[str, Any]], before: dict[tuple[str, str], float]) -> str:
    lines = [
        "MB/s: raw fp32 bytes of the full state (weights and both Adam moments) per second, the "
        "range over the interleaved rounds. Ratio: those bytes over the delta checkpoint's stored "
        "bytes" + (" (before: the ratio at the earlier run given by --before)." if before else "."),
        "",
        "| state | params | mode | threads | save MB/s | save MB/s per thread | load MB/s | ratio "
        + ("| ratio before " if before else "") + "|",
        "|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if before else ""),
    ]
    for row in rows:
        raw = row["raw_bytes"]
        per_thread = [s * row["threads"] for s in row["save_s"]]
        ratio = raw / row["stored_bytes"]
        previous = before.get((row["state"], row["mode"]))
        lines.append(
            f"| {row['state']} | {row['params'] / 1e6:.1f}M | {row['mode']} | {row['threads']} | "
            f"{speed_range(raw, row['save_s'])} | {speed_range(raw, per_thread)} | "
            f"{speed_range(raw, row['load_s'])} | {ratio:.1f}x |"
            + (f" {previous:.1f}x |" if previous else (" - |" if before else "")))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--states", type=csv(list(STATES)), default=list(STATES))
    parser.add_argument("--modes", type=csv(list(MODES)), default=list(MODES))
    parser.add_argument("--threads", type=thread_counts, default=[1, os.cpu_count() or 1],
                        help="thread counts (default: 1 and all cores)")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--synthetic-gb", type=float, default=1.0)
    parser.add_argument("--demo-steps", type=int, default=20)
    parser.add_argument("--demo-delta", type=int, default=5)
    parser.add_argument("--before", type=Path, help="a JSON of an earlier run: its ratios")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    threads = sorted(set(args.threads))
    before: dict[tuple[str, str], float] = {}
    if args.before:
        for row in json.loads(args.before.read_text())["rows"]:
            before[(row["state"], row["mode"])] = row["raw_bytes"] / row["stored_bytes"]
    info = machine_info()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.states:
            print(f"building the {name} state ...", file=sys.stderr, flush=True)
            torch.set_num_threads(os.cpu_count() or 1)
            if name == "demo":
                first, second, params = demo_states(args.demo_steps, args.demo_delta)
            else:
                first, second, params = synthetic_states(args.synthetic_gb)
            rows += measure(name, first, second, params, args.modes, threads, args.repeat,
                            Path(workdir))
            del first, second
    text = ("## Lossy save and load speed\n\n" + info_markdown(info) + "\n\n"
            + markdown(rows, before) + "\n")
    print(text)
    write_results("lossy_speed", text, {"machine": info, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
