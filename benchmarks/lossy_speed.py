"""How fast the lossy modes save and load, beside the lossless path, on one thread and on all.

Two states, each a lossless keyframe and then a delta checkpoint against it (the delta is what is
timed; a lossy mode's first checkpoint is lossless anyway):

* ``demo``: the demo's GPT (10.8M parameters, AdamW), trained on its corpus; the keyframe after
  ``--demo-steps`` steps, the delta after ``--demo-delta`` more;
* ``synthetic``: a GPT-shaped state of at least ``--synthetic-gb`` of raw fp32 weights plus both
  Adam moments, stepped by AdamW with synthetic gradients (a low-rank part plus noise, as real
  updates between checkpoints are close to low rank);
* ``square`` (not by default): four ``--square`` x ``--square`` weights (4096: 64 MB tensors, an
  LLM's) with their moments, stepped the same way.

Per state, mode and thread count: save and load MB/s, where MB is the raw fp32 bytes of the full
state (weights and both moments, 12 bytes a parameter), and the ratio of those bytes to the stored
ones. Runs interleave the modes (``--repeat`` rounds); the table gives each figure's range over
the rounds. The save clock covers ``ckptzip.save`` only (the input is ready in memory, the base is
a file on disk as in training); the load clock covers ``ckptzip.load`` into fresh tensors, then
again at once into memory the first load faulted in and freed ("load again": on a VM, memory
the host has taken back costs about 2 s a GB to fault in, whatever writes it;
``probes/fresh_memory.py``). The bit-exact and error checks are outside both.

``--before FILE``: a JSON this script wrote earlier (say at the commit before a change): its
ratios go beside the new ones.

``--device cuda``: the states live on the GPU, as in training. Each save then runs the lossy
transforms there (torch ops) and copies only their codes to the host. Besides the save and load
clocks, each lossy mode's device transforms are timed alone (``prepare`` against the keyframe, to
the last kernel, before any copy to the host): **transform GB/s** is the state's raw bytes over
that time, and **peak extra GPU memory** is the most the device held above the state (and the
test's own tensors) during it, as a multiple of the state's bytes. Loads decode to host memory.

    python benchmarks/lossy_speed.py [--states demo,synthetic] [--synthetic-gb 1.0]
        [--threads 1,2] [--modes lossless,excp,bitsnap,adaptive] [--repeat 2] [--before FILE]
        [--device cuda] [--tune-malloc]
"""

from __future__ import annotations

import argparse
import json
import os
import re
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
from ckptzip.planning import prepare
from ckptzip.reader import open_base
from ckptzip.tree import flatten

MODES = ("lossless", "excp", "bitsnap", "adaptive")
STATES = ("demo", "synthetic", "square")
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
    return stepped_states(params, torch.optim.AdamW(list(params.values()), lr=3e-4,
                                                    weight_decay=0.1), generator)


def stepped_states(params: dict[str, torch.nn.Parameter], optimizer: torch.optim.Optimizer,
                   generator: torch.Generator) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The full state (deep copies) after 3 optimizer steps and after 2 more, each gradient a
    random rank-``GRADIENT_RANK`` product (matrices) plus ``GRADIENT_NOISE`` of noise, times
    1e-3; and the parameter count."""
    import copy

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


def square_states(side: int, count: int = 4) -> tuple[dict[str, Any], dict[str, Any], int]:
    """``count`` side x side weights with AdamW's moments after 3 steps and after 2 more, the
    gradients a rank-``GRADIENT_RANK`` product plus noise: tensors of an LLM's size (a 4096 x
    4096 fp32 weight is 64 MB), where the synthetic state's are at most 32 MB."""
    generator = torch.Generator().manual_seed(0)
    params = {f"w{i}": torch.nn.Parameter(0.02 * torch.randn(side, side, generator=generator))
              for i in range(count)}
    return stepped_states(params, torch.optim.AdamW(list(params.values()), lr=3e-4), generator)


def timed(run: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, float, Any]:
    """Wall seconds, this process's CPU seconds (all its threads) and the result of a call."""
    started, cpu = time.perf_counter(), time.process_time()
    result = run(*args, **kwargs)
    return time.perf_counter() - started, time.process_time() - cpu, result


def on_device(state: Any, device: str) -> Any:
    """A copy of ``state`` with every tensor on ``device``."""
    if isinstance(state, torch.Tensor):
        return state.to(device, copy=True)
    if isinstance(state, dict):
        return {k: on_device(v, device) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(on_device(v, device) for v in state)
    return state


def device_transform(state: Any, mode: str, keyframe: Path, count: int,
                     read_ahead: bool) -> tuple[float, int]:
    """Seconds of ``mode``'s transforms of the device ``state`` against ``keyframe`` (to the last
    kernel, nothing copied to the host), and the peak device bytes allocated above what was
    allocated before. ``read_ahead``: the base's tensors are decoded to host memory before the
    clock starts (what is left is the device's work and the base's copies to it)."""
    base = open_base(keyframe, threads=count)
    assert base is not None
    try:
        if read_ahead:
            names = [leaf.name for leaf in flatten(state)[1] if base.tensor(leaf.name) is not None]
            base.prefetch(names)
            for name in names:
                base.raw(name)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        started = time.perf_counter()
        prepared = prepare(state, mode=mode, base=base, resumed=True, threads=count)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        peak = torch.cuda.max_memory_allocated() - before
    finally:
        base.close()
    del prepared
    return seconds, peak


def measure(name: str, first: dict[str, Any], second: dict[str, Any], params: int,
            modes: list[str], threads: list[int], repeat: int, workdir: Path,
            device: str = "cpu") -> list[dict[str, Any]]:
    """Each (mode, threads)'s save and load seconds over ``repeat`` interleaved rounds (and on
    a GPU, its device transforms' seconds and peak extra memory)."""
    raw = 12 * params
    keyframe = workdir / f"{name}-keyframe.ckz"
    ckptzip.save(first, keyframe, mode="lossless")
    if device != "cpu":
        second = on_device(second, device)
    rows: dict[tuple[str, int], dict[str, Any]] = {
        (m, t): {"state": name, "mode": m, "threads": t, "params": params, "raw_bytes": raw,
                 "device": device, "save_s": [], "load_s": [], "save_cpu_s": [],
                 "load_cpu_s": [], "load_again_s": [], "transform_s": [], "transform_read_s": [],
                 "peak_extra_bytes": []}
        for m in modes for t in threads}
    for round_ in range(repeat):
        for count in threads:
            torch.set_num_threads(count)
            for mode in modes:
                row = rows[(mode, count)]
                path = workdir / f"{name}-{mode}-{count}.ckz"
                seconds, cpu, report = timed(ckptzip.save, second, path, mode=mode,
                                             base=keyframe, resumed=True, threads=count)
                row["save_s"].append(seconds)
                row["save_cpu_s"].append(cpu)
                row["stored_bytes"] = report.stored_bytes
                seconds, cpu, _ = timed(ckptzip.load, path, threads=count)
                row["load_s"].append(seconds)
                row["load_cpu_s"].append(cpu)
                # at once again: into memory the first load faulted in and freed (on a VM, memory
                # the host has taken back faults in at about 0.5 GB/s: probes/fresh_memory.py)
                seconds, _, _ = timed(ckptzip.load, path, threads=count)
                row["load_again_s"].append(seconds)
                extra = ""
                if device != "cpu" and mode != "lossless":
                    seconds, peak = device_transform(second, mode, keyframe, count, True)
                    read_s, read_peak = device_transform(second, mode, keyframe, count, False)
                    row["transform_s"].append(seconds)
                    row["transform_read_s"].append(read_s)
                    row["peak_extra_bytes"].append(max(peak, read_peak))
                    extra = (f", transforms {raw / seconds / 1e9:.2f} GB/s "
                             f"({raw / read_s / 1e9:.2f} with the base's read), peak extra "
                             f"{max(peak, read_peak) / raw:.2f}x")
                print(f"{name} round {round_ + 1}: {mode:>8} x{count}: save "
                      f"{raw / row['save_s'][-1] / 1e6:7.1f} MB/s, load "
                      f"{raw / row['load_s'][-1] / 1e6:7.1f} MB/s (again "
                      f"{raw / row['load_again_s'][-1] / 1e6:7.1f}), ratio "
                      f"{raw / report.stored_bytes:.1f}x{extra}", file=sys.stderr, flush=True)
                path.unlink()
    return list(rows.values())


def earlier_ratios(text: str) -> dict[tuple[str, str], float]:
    """The ratio of each (state, mode) of an earlier run: from its JSON, or from the lines it
    printed as it went (a run stopped before it wrote its JSON)."""
    if text.lstrip().startswith("{"):
        return {(row["state"], row["mode"]): row["raw_bytes"] / row["stored_bytes"]
                for row in json.loads(text)["rows"]}
    found = {}
    for match in re.finditer(r"^(\w+) round \d+: +(\w+) x\d+: .* ratio ([\d.]+)x$", text, re.M):
        found[(match[1], match[2])] = float(match[3])
    return found


def speed_range(raw: int, seconds: list[float]) -> str:
    rates = sorted(raw / s / 1e6 for s in seconds)
    if len(rates) == 1 or rates[-1] < rates[0] * 1.005:
        return f"{statistics.median(rates):,.1f}"
    return f"{rates[0]:,.1f}-{rates[-1]:,.1f}"


def gigabytes_range(raw: int, seconds: list[float]) -> str:
    rates = sorted(raw / s / 1e9 for s in seconds)
    return f"{rates[0]:.2f}" if rates[-1] < rates[0] * 1.005 else f"{rates[0]:.2f}-{rates[-1]:.2f}"


def device_markdown(rows: list[dict[str, Any]]) -> str:
    """The device transforms' table (a GPU run)."""
    lines = ["Device transforms: `prepare` of the state on the GPU against the keyframe, to the "
             "last kernel, nothing copied back. GB/s: the state's raw fp32 bytes per second, the "
             "range over the rounds; *base read ahead*: the keyframe's tensors decoded to host "
             "memory before the clock (the clock holds the device's work and the base's copies "
             "to it); *with the base's read*: decoding the keyframe file inside the clock. Peak "
             "extra: the most GPU memory allocated above the state during either, over the "
             "state's bytes (the largest over the rounds).", "",
             "| state | mode | threads | transform GB/s, base read ahead | with the base's read "
             "| peak extra GPU memory | / state |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if not row["transform_s"]:
            continue
        raw = row["raw_bytes"]
        peak = max(row["peak_extra_bytes"])
        lines.append(f"| {row['state']} | {row['mode']} | {row['threads']} | "
                     f"{gigabytes_range(raw, row['transform_s'])} | "
                     f"{gigabytes_range(raw, row['transform_read_s'])} | "
                     f"{peak / 1e6:,.0f} MB | {peak / raw:.2f}x |")
    return "\n".join(lines)


def markdown(rows: list[dict[str, Any]], before: dict[tuple[str, str], float]) -> str:
    lines = [
        "MB/s: raw fp32 bytes of the full state (weights and both Adam moments) per second of "
        "wall time, the range over the interleaved rounds. MB/CPU-s: the same bytes per second of "
        "this process's CPU time (all its threads): the speed per busy core, which a machine "
        "shared with other work slows less than the wall clock. Load again: the same file loaded "
        "at once a second time, into memory the first load faulted in. Ratio: those bytes over "
        "the delta "
        "checkpoint's stored bytes"
        + (" (before: the ratio at the earlier run given by --before)." if before else "."),
        "",
        "| state | params | mode | threads | save MB/s | save MB/CPU-s | load MB/s | load MB/CPU-s "
        "| load again MB/s | ratio " + ("| ratio before " if before else "") + "|",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if before else ""),
    ]
    for row in rows:
        raw = row["raw_bytes"]
        ratio = raw / row["stored_bytes"]
        previous = before.get((row["state"], row["mode"]))
        lines.append(
            f"| {row['state']} | {row['params'] / 1e6:.1f}M | {row['mode']} | {row['threads']} | "
            f"{speed_range(raw, row['save_s'])} | {speed_range(raw, row['save_cpu_s'])} | "
            f"{speed_range(raw, row['load_s'])} | {speed_range(raw, row['load_cpu_s'])} | "
            f"{speed_range(raw, row['load_again_s'])} | {ratio:.1f}x |"
            + (f" {previous:.1f}x |" if previous else (" - |" if before else "")))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--states", type=csv(list(STATES)), default=["demo", "synthetic"],
                        help="demo, synthetic (the scoreboard's two) and square")
    parser.add_argument("--modes", type=csv(list(MODES)), default=list(MODES))
    parser.add_argument("--threads", type=thread_counts, default=[1, os.cpu_count() or 1],
                        help="thread counts (default: 1 and all cores)")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--synthetic-gb", type=float, default=1.0)
    parser.add_argument("--square", type=int, default=4096,
                        help="the square state's side: four N x N weights (default 4096)")
    parser.add_argument("--demo-steps", type=int, default=20)
    parser.add_argument("--demo-delta", type=int, default=5)
    parser.add_argument("--before", type=Path,
                        help="an earlier run's JSON, or its log (the lines it prints): its ratios")
    parser.add_argument("--tune-malloc", action="store_true",
                        help="call ckptzip.tune_malloc() first, as the ckptzip command does")
    parser.add_argument("--device", default="cpu",
                        help="where the states live while saved: cpu, or cuda (a GPU)")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    if args.device != "cpu" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this machine has no CUDA device; run on a GPU "
                     "host or leave --device out")
    if args.tune_malloc and not ckptzip.tune_malloc():
        parser.error("--tune-malloc: this process's C library is not glibc")
    threads = sorted(set(args.threads))
    before: dict[tuple[str, str], float] = {}
    if args.before:
        before = earlier_ratios(args.before.read_text())
    info = machine_info()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.states:
            print(f"building the {name} state ...", file=sys.stderr, flush=True)
            torch.set_num_threads(os.cpu_count() or 1)
            if name == "demo":
                first, second, params = demo_states(args.demo_steps, args.demo_delta)
            elif name == "square":
                first, second, params = square_states(args.square)
            else:
                first, second, params = synthetic_states(args.synthetic_gb)
            rows += measure(name, first, second, params, args.modes, threads, args.repeat,
                            Path(workdir), args.device)
            del first, second
    text = ("## Lossy save and load speed\n\n" + info_markdown(info) + "\n\n"
            + (f"States on `{args.device}`.\n\n" if args.device != "cpu" else "")
            + markdown(rows, before) + "\n")
    if any(row["transform_s"] for row in rows):
        text += "\n" + device_markdown(rows) + "\n"
    print(text)
    write_results("lossy_speed", text, {"machine": info, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
