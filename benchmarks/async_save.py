"""How long a save stalls the training loop, with ckptzip's CheckpointManager async and sync,
against torch.save and against the host copy alone; and how much extra host memory a save takes.

On the demo's small GPT (10.8M parameters, AdamW: weights and both moments, about 130 MB), a few
training steps between saves so that deltas are real. The stall is the time ``save`` takes to
return; the peak is the resident set size, sampled every millisecond from just before ``save``
until the background write has finished, minus the RSS before it. The manager holds its newest
checkpoint as decoded between saves (``cache_decoded``, by default): those bytes are already in
the RSS before a save, so they are reported on their own ("held"), and each manager arm runs
again with ``cache_decoded=False`` (nothing held; each delta decodes its base instead).

    python benchmarks/async_save.py [--saves 4] [--steps-between 2] [--threads N]
        [--device cuda] [--modes lossless,excp] [--layers 6 --width 384]

On a GPU (``--device cuda``) the model trains there; a lossy mode's async save transforms the
state on the device and copies only the codes to the host (CheckpointManager's device path).

Targets (issue 6): async stall <= 1.5x the host copy alone; peak extra memory <= 1.2x the state.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from common import OUT_DIR, info_markdown, machine_info, write_results

from ckptzip import CheckpointManager
from ckptzip.demo.gpt import GPT, GPTConfig, make_optimizer
from ckptzip.manager import device_snapshot, snapshot


def rss() -> int:
    """This process's resident set size in bytes (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples the RSS in a thread until stopped; ``extra`` is the peak minus the start."""

    def __init__(self) -> None:
        self.start = rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())
        return self.peak - self.start


@dataclass
class Row:
    method: str
    stall_s: float
    total_s: float
    extra_memory_mb: float
    file_mb: float
    extra_gpu_mb: float = 0.0
    #: What the manager holds between saves (its newest checkpoint as decoded), largest seen.
    held_mb: float = 0.0


def train_steps(model: GPT, optimizer: torch.optim.Optimizer, n: int, seed: int) -> None:
    device = next(model.parameters()).device
    for i in range(n):
        tokens = torch.randint(0, 256, (4, 65), generator=torch.Generator().manual_seed(seed * 100 + i))
        tokens = tokens.to(device)
        _, loss = model(tokens[:, :-1], tokens[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if device.type == "cuda":
        torch.cuda.synchronize()


def new_model(config: GPTConfig, device: str) -> tuple[GPT, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = GPT(config).to(device)
    return model, make_optimizer(model)


def measure(method: str, saves: int, steps_between: int, config: GPTConfig, device: str,
            save: Callable[[int, Any], None], finish: Callable[[], None], directory: str,
            held: Callable[[], int] = lambda: 0) -> Row:
    """Median stall and total time, and the largest extra memory, over ``saves`` saves (the
    first, a keyframe even for lossy modes, is not timed when there are more)."""
    model, optimizer = new_model(config, device)
    stalls, totals, extras, gpu_extras, helds = [], [], [], [], []
    cuda = device == "cuda"
    for k in range(saves + (saves > 1)):
        train_steps(model, optimizer, steps_between, k)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": k}
        if cuda:
            torch.cuda.reset_peak_memory_stats()
            gpu_before = torch.cuda.memory_allocated()
        peak = PeakRSS()
        started = time.perf_counter()
        save(k, state)
        stall = time.perf_counter() - started
        finish()
        helds.append(held())
        if k or saves == 1:
            stalls.append(stall)
            totals.append(time.perf_counter() - started)
            extras.append(peak.stop())
            if cuda:
                gpu_extras.append(torch.cuda.max_memory_allocated() - gpu_before)
        else:
            peak.stop()
    files = [f for f in Path(directory).iterdir() if f.suffix in (".ckz", ".pt")]
    size = sum(f.stat().st_size for f in files) / max(1, len(files))  # the mean checkpoint
    return Row(method, statistics.median(stalls), statistics.median(totals), max(extras) / 1e6,
               size / 1e6, max(gpu_extras, default=0) / 1e6, max(helds) / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--saves", type=int, default=4)
    parser.add_argument("--steps-between", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="where the model trains (cpu, cuda)")
    parser.add_argument("--modes", default="lossless", help="comma-separated ckptzip modes")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--width", type=int, default=384, help="n_embd (a multiple of 64)")
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    config = GPTConfig(n_layer=args.layers, n_head=args.width // 64, n_embd=args.width)
    model, optimizer = new_model(config, args.device)
    n_params = sum(p.numel() for p in model.parameters())
    train_steps(model, optimizer, 1, 0)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    state_bytes += sum(v.numel() * v.element_size() for s in optimizer.state.values()
                       for v in s.values() if isinstance(v, torch.Tensor))
    copy_times = []
    for _ in range(5):
        started = time.perf_counter()
        snapshot(state)
        copy_times.append(time.perf_counter() - started)
    host_copy = statistics.median(copy_times)
    device_copy = None
    if args.device == "cuda":  # the lossy modes' async path clones on the device instead
        device_times = []
        for _ in range(5):
            started = time.perf_counter()
            device_snapshot(state)
            torch.cuda.synchronize()
            device_times.append(time.perf_counter() - started)
        device_copy = statistics.median(device_times)
    del model, optimizer, state

    rows = []
    with tempfile.TemporaryDirectory() as directory:
        def torch_save(step: int, state: Any) -> None:
            torch.save(state, os.path.join(directory, f"step-{step}.pt"))

        rows.append(measure("torch.save", args.saves, args.steps_between, config, args.device,
                            torch_save, lambda: None, directory))
    for mode in args.modes.split(","):
        for async_save in (False, True):
            for cache in (None, False):
                with tempfile.TemporaryDirectory() as directory:
                    manager = CheckpointManager(directory, mode=mode, async_save=async_save,
                                                threads=args.threads, cache_decoded=cache)
                    label = (f"ckptzip manager {mode}, async {'on' if async_save else 'off'}"
                             + (", unheld" if cache is False else ""))

                    def held(manager: CheckpointManager = manager) -> int:
                        return 0 if manager._held is None else manager._held.nbytes

                    rows.append(measure(label, args.saves, args.steps_between, config,
                                        args.device, manager.save, manager.wait, directory, held))
                    manager.close()

    info = machine_info()
    lines = [
        "# Stall per save: CheckpointManager async vs sync vs torch.save", "", info_markdown(info), "",
        f"State: GPT ({n_params / 1e6:.1f}M parameters, {args.layers} layers of width {args.width}) "
        f"+ AdamW on {args.device}, {state_bytes / 1e6:.1f} MB; {args.saves} timed saves, "
        f"{args.steps_between} training steps between; host copy alone (`snapshot`): "
        f"**{host_copy * 1e3:.0f} ms** (median of 5)"
        + (f"; device copy alone (`device_snapshot`): **{device_copy * 1e3:.1f} ms**."
           if device_copy is not None else "."), "",
        "| method | stall per save (median) | save to durable file (median) | stall / host copy "
        "| peak extra RSS | / state | held between saves | peak extra GPU memory | file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        gpu = f"{row.extra_gpu_mb:.0f} MB" if args.device == "cuda" else "-"
        lines.append(
            f"| {row.method} | {row.stall_s * 1e3:.0f} ms | {row.total_s * 1e3:.0f} ms | "
            f"{row.stall_s / host_copy:.2f}x | {row.extra_memory_mb:.0f} MB | "
            f"{row.extra_memory_mb * 1e6 / state_bytes:.2f}x | {row.held_mb:.0f} MB | {gpu} | "
            f"{row.file_mb:.1f} MB |"
        )
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    name = "async_save" if args.device == "cpu" else f"async_save_{args.device}"
    data = {"info": info, "state_bytes": state_bytes, "device": args.device, "host_copy_s": host_copy,
            "device_copy_s": device_copy, "rows": [asdict(r) for r in rows]}
    write_results(name, markdown, data, args.out)


if __name__ == "__main__":
    main()
