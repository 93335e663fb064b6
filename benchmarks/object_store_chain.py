"""A CheckpointManager's delta chain on a bucket: each save's seconds and S3 traffic, the newest
checkpoint held as decoded (the default) and not, beside ``torch.save`` + s3fs of every
checkpoint whole. One local S3 server (SeaweedFS on 127.0.0.1, started here by
tests/s3server.py), one run.

The state is object_store.py's transformer training state (``--blocks`` of width ``--width``: 151
MB at 1 of 1024, fp32 weights with AdamW's moments), moved between checkpoints by ``--steps``
synthetic AdamW steps (random gradients; outside every clock). ``--checkpoints`` saves make one
chain (``keyframe_every`` = that many: a keyframe, then deltas at depth 1, 2, ...), each
synchronous (``async_save=False``), so a save's wall time is what a step would wait for.

Arms, taking turns in each of ``--repeat`` rounds, each on its own prefix:

* ``lossless``, ``adaptive``: ``CheckpointManager("s3://...", mode=...)``, the newest checkpoint
  held as decoded (``cache_decoded=None``, the default: the state fits);
* ``lossless-unheld``, ``adaptive-unheld``: ``cache_decoded=False``: each delta's save first
  decodes its base's chain, fetching those objects (the same files are written);
* ``torch.save+s3fs``: ``torch.save`` to a local file, then ``put_file`` (what users do without
  ckptzip; every checkpoint whole).

Traffic is counted at s3fs's S3 calls as object_store.py counts it (PUT and UploadPart bodies
sent, GET bodies read). Reported per arm: the keyframe's seconds, the deltas' seconds (mean and
range), the deepest delta's, and the MB downloaded and uploaded per delta.

    python benchmarks/object_store_chain.py --out docs/scoreboard/raw
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from common import OUT_DIR, info_markdown, machine_info, write_results
from object_store import SeaweedS3, Traffic, training_state

from ckptzip.manager import CheckpointManager

ARMS = ("lossless", "adaptive", "lossless-unheld", "adaptive-unheld", "torch.save+s3fs")


def adamw_steps(state: dict[str, Any], steps: int, generator: torch.Generator) -> dict[str, Any]:
    """``state`` after ``steps`` AdamW steps on random gradients (a copy; lr 3e-4, betas 0.9 /
    0.95, decay 0.1), its step counters moved on."""
    model = {name: weight.clone() for name, weight in state["model"].items()}
    moments = {index: {key: value.clone() for key, value in entry.items()}
               for index, entry in state["optimizer"]["state"].items()}
    for _ in range(steps):
        for index, name in enumerate(model):
            weight, entry = model[name], moments[index]
            grad = torch.randn(weight.shape, generator=generator) * 1e-3
            entry["exp_avg"].mul_(0.9).add_(grad, alpha=0.1)
            entry["exp_avg_sq"].mul_(0.95).addcmul_(grad, grad, value=0.05)
            entry["step"] += 1
            weight.mul_(1 - 3e-4 * 0.1)
            weight.addcdiv_(entry["exp_avg"], entry["exp_avg_sq"].sqrt().add_(1e-8), value=-3e-4)
    step = state["step"] + steps
    return {"model": model, "optimizer": {"state": moments,
                                          "param_groups": state["optimizer"]["param_groups"]},
            "scheduler": {**state["scheduler"], "last_epoch": step}, "step": step}


def run_arm(arm: str, states: list[dict[str, Any]], url: str, options: dict[str, Any],
            traffic: Traffic, fs: Any, threads: int, work: Path) -> list[dict[str, float]]:
    """One chain of ``len(states)`` saves; per save its seconds and MB down and up."""
    saves = []
    if arm == "torch.save+s3fs":
        for step, state in enumerate(states):
            local = work / f"step-{step}.pt"
            traffic.reset()
            started = time.perf_counter()
            torch.save(state, local)
            fs.put_file(str(local), f"{url}/step-{step}.pt")
            seconds = time.perf_counter() - started
            saves.append({"seconds": seconds, "down_mb": traffic.down / 1e6,
                          "up_mb": traffic.up / 1e6})
            local.unlink()
        return saves
    mode = arm.split("-")[0]
    cache = False if arm.endswith("-unheld") else None
    with CheckpointManager(url, mode=mode, keyframe_every=len(states), async_save=False,
                           cache_decoded=cache, threads=threads,
                           storage_options=options) as manager:
        for step, state in enumerate(states):
            traffic.reset()
            started = time.perf_counter()
            manager.save(step, state)
            seconds = time.perf_counter() - started
            saves.append({"seconds": seconds, "down_mb": traffic.down / 1e6,
                          "up_mb": traffic.up / 1e6})
    return saves


def markdown(result: dict[str, Any], info: dict[str, Any]) -> str:
    lines = ["# A CheckpointManager's delta chain on a bucket (SeaweedFS on 127.0.0.1)", "",
             info_markdown(info), "",
             f"State: {result['state_mb']:.0f} MB (fp32 weights and AdamW's moments); "
             f"{result['checkpoints']} checkpoints, {result['steps']} synthetic AdamW steps apart; "
             f"{result['repeat']} rounds, the arms taking turns; {result['threads']} threads.", "",
             "| arm | keyframe s | deltas s: mean [min, max] | deepest delta s | MB down per delta: "
             "mean [min, max] | MB up per delta: mean |",
             "|---|---|---|---|---|---|"]
    for arm in result["arms"]:
        rounds = result["saves"][arm]
        first = [r[0]["seconds"] for r in rounds]
        deltas = [s for r in rounds for s in r[1:]]
        deepest = [r[-1]["seconds"] for r in rounds]
        down = [s["down_mb"] for s in deltas]
        lines.append(
            f"| {arm} | {min(first):.2f}-{max(first):.2f} | "
            f"{statistics.mean(s['seconds'] for s in deltas):.2f} "
            f"[{min(s['seconds'] for s in deltas):.2f}, {max(s['seconds'] for s in deltas):.2f}] | "
            f"{min(deepest):.2f}-{max(deepest):.2f} | {statistics.mean(down):.1f} "
            f"[{min(down):.1f}, {max(down):.1f}] | "
            f"{statistics.mean(s['up_mb'] for s in deltas):.1f} |")
    lines += ["", "Per save (round, arm: seconds / MB down / MB up, by chain depth):", ""]
    for index in range(result["repeat"]):
        for arm in result["arms"]:
            cells = ", ".join(f"{s['seconds']:.2f}/{s['down_mb']:.1f}/{s['up_mb']:.1f}"
                              for s in result["saves"][arm][index])
            lines.append(f"- round {index + 1}, {arm}: {cells}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=1)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--checkpoints", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5, help="AdamW steps between checkpoints")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--out", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    arms = args.arms.split(",")
    unknown = set(arms) - set(ARMS)
    if unknown:
        parser.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    info = machine_info()
    generator = torch.Generator().manual_seed(1)
    states = [training_state(args.blocks, args.width)]
    for _ in range(args.checkpoints - 1):
        states.append(adamw_steps(states[-1], args.steps, generator))
    state_mb = sum(t.nbytes for t in states[0]["model"].values()) * 3 / 1e6
    work = Path(tempfile.mkdtemp(prefix="ckptzip-chain-"))
    server = SeaweedS3(work / "seaweedfs").start()
    saves: dict[str, list[list[dict[str, float]]]] = {arm: [] for arm in arms}
    try:
        traffic = Traffic()
        options = server.storage_options()
        fs = server.filesystem()
        bucket = server.bucket("chain")
        for index in range(args.repeat):
            for arm in arms:
                url = f"s3://{bucket}/{index}/{arm}"
                saves[arm].append(run_arm(arm, states, url, options, traffic, fs, args.threads, work))
                print(f"round {index + 1}, {arm}: "
                      + ", ".join(f"{s['seconds']:.2f}s" for s in saves[arm][-1]), flush=True)
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    result = {"state_mb": state_mb, "checkpoints": args.checkpoints, "steps": args.steps,
              "repeat": args.repeat, "threads": args.threads, "arms": arms, "saves": saves}
    text = markdown(result, info)
    print(text)
    suffix = "-quick" if args.blocks * args.width < 1024 else ""
    write_results(f"object_store_chain{suffix}", text, {**result, "machine": info}, args.out)


if __name__ == "__main__":
    main()
