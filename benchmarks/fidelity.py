"""Fidelity of the lossy modes: does training resumed from a reconstructed checkpoint go on as if
nothing had happened?

One reference run per arm, all with the same seed and data order: train a small GPT on the
Python standard library's source, checkpoint every ``--every`` steps as a chain (the first
checkpoint a lossless keyframe), and, in every arm, resume training from the checkpoint *as
decoded* at every checkpoint (closed loop, ExCP's protocol). The lossless arm is the reference.
The ``adaptive-open`` arm instead lets training go on from the true state, as it does when nothing
fails, and reports the loss of each checkpoint *as decoded*: a chain's error there carries the
errors before it, and this arm shows whether it stays bounded.

Per arm: bytes per checkpoint; the ratio of the raw fp32 full state (weights and both Adam
moments) to the stored bytes, over the delta checkpoints; bits per parameter; the model-state
ratio (raw fp32 weights over the weights' stored bytes); the final train and validation loss and
their gap to the lossless arm; the MSE and relative error of each state, as decoded. Writes
``benchmarks/out/fidelity.{md,json,png}``.

The model is smaller than the demo's 10.8M-parameter GPT (see ``FULL``): four lossy arms of a few
hundred steps each must run in minutes on a busy 2-core machine. ``--quick`` (the tests) uses the
tiny model for 60 steps.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

import ckptzip
from ckptzip.cli import parse_error_budget
from ckptzip.demo.gpt import GPTConfig
from ckptzip.demo.train import CONFIGS, TrainConfig, evaluate, load_data, make_trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT_DIR, info_markdown, machine_info, write_results

#: 0.44M parameters (2 layers, width 128, context 64): 3-5 steps/s on one core of the busy 2-core
#: machine, where the demo's 10.8M model manages well under 1 (4 arms of 320 steps: minutes, not
#: hours). Two layers keep the tensor count, and so the per-tensor header, low.
FULL = TrainConfig(model=GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=64), batch_size=16,
                   lr=1e-3, corpus_bytes=2_000_000)
QUICK = CONFIGS["tiny"]
ARMS: dict[str, dict[str, Any]] = {
    "lossless": {"mode": "lossless"},
    "excp": {"mode": "excp"},
    "bitsnap": {"mode": "bitsnap"},
    "adaptive": {"mode": "adaptive"},
    "adaptive-open": {"mode": "adaptive", "resume": False},
}
STATES = ("weights", "exp_avg", "exp_avg_sq")
EVAL_BATCHES = 16


@dataclass
class Arm:
    name: str
    mode: str
    options: dict[str, Any]
    #: Training resumes from each decoded checkpoint (else it goes on from the true state, and
    #: the losses are those of the decoded checkpoints).
    resume: bool = True
    steps: list[int] = field(default_factory=list)
    stored_bytes: list[int] = field(default_factory=list)
    weight_bytes: list[int] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    #: Per delta checkpoint and state: (squared error sum, squared norm sum, elements).
    errors: list[dict[str, tuple[float, float, int]]] = field(default_factory=list)
    #: Per delta checkpoint: the weights' error over the update training made since the one
    #: before, |W^ - W| / |W - W_start|.
    update_errors: list[float] = field(default_factory=list)
    seconds: float = 0.0


def kind_of(name: str) -> str | None:
    """Which state a tensor of the demo's checkpoint belongs to."""
    if name.startswith("model."):
        return "weights"
    if name.startswith("optimizer.state.") and name.rsplit(".", 1)[-1] in STATES:
        return name.rsplit(".", 1)[-1]
    return None


def flat(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    items = state.items() if isinstance(state, dict) else (
        enumerate(state) if isinstance(state, (list, tuple)) else ())
    out: dict[str, torch.Tensor] = {}
    for key, value in items:
        out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def state_errors(original: Any, decoded: Any) -> dict[str, tuple[float, float, int]]:
    sums = {kind: (0.0, 0.0, 0) for kind in STATES}
    seen: set[int] = set()
    decoded_flat = flat(decoded)
    for name, tensor in flat(original).items():
        kind = kind_of(name)
        if kind is None or tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())  # a tied weight counts once
        diff = (decoded_flat[name].double() - tensor.double()).pow(2).sum()
        err, norm, n = sums[kind]
        sums[kind] = (err + float(diff), norm + float(tensor.double().pow(2).sum()), n + tensor.numel())
    return sums


def weights_of(state: Any) -> torch.Tensor:
    """Every weight of the demo's checkpoint, flattened into one float64 vector."""
    return torch.cat([t.detach().double().reshape(-1) for t in state["model"].values()])


def run_arm(arm: Arm, config: TrainConfig, steps: int, every: int, seed: int, workdir: Path) -> None:
    train_data, val_data = load_data(config)
    trainer = make_trainer(config, steps, seed)
    block = config.model.block_size
    previous: Path | None = None
    start = weights_of(trainer.state())  # the weights training went on from
    started = time.perf_counter()
    for step in range(every, steps + 1, every):
        arm.train_loss += trainer.train(train_data, every)
        state = trainer.state()
        path = workdir / f"{arm.name}-{step:05d}.ckz"
        # a closed-loop arm trained from the previous checkpoint as decoded: it says so
        report = ckptzip.save(state, path, mode=arm.mode, base=previous, resumed=arm.resume,
                              **arm.options)
        decoded = ckptzip.load(path)
        with ckptzip.open(path) as checkpoint:
            arm.weight_bytes.append(sum(
                chunk.length for leaf in checkpoint.leaves if leaf.name.startswith("model.")
                for chunk in leaf.chunks))
        true = weights_of(state)
        if previous is not None:
            arm.errors.append(state_errors(state, decoded))
            update = float((true - start).norm())
            arm.update_errors.append(float((weights_of(decoded) - true).norm()) / update)
        # the decoded checkpoint's loss; then training goes on from what was stored (closed
        # loop) or, in an open arm, from the true state
        kept = None if arm.resume else copy.deepcopy(state)
        trainer.restore(decoded)
        arm.val_loss.append(evaluate(trainer.model, val_data, EVAL_BATCHES, config.batch_size,
                                     block))
        if kept is None:
            start = weights_of(decoded)
        else:
            trainer.restore(kept)
            start = true
        arm.steps.append(step)
        arm.stored_bytes.append(report.stored_bytes)
        print(f"{arm.name:>9} step {step:4d}: {report.stored_bytes:>10,} bytes, "
              f"val {arm.val_loss[-1]:.4f}", file=sys.stderr, flush=True)
        previous = path
    arm.seconds = time.perf_counter() - started


def summary(arm: Arm, reference: Arm, params: int, every: int) -> dict[str, Any]:
    """The figures of one arm (delta checkpoints only for ratios and errors)."""
    deltas = arm.stored_bytes[1:]
    mean_bytes = sum(deltas) / len(deltas)
    mean_weight = sum(arm.weight_bytes[1:]) / len(deltas)
    full_raw = 3 * 4 * params
    errors = {}
    for kind in STATES:
        err = sum(e[kind][0] for e in arm.errors)
        norm = sum(e[kind][1] for e in arm.errors)
        n = sum(e[kind][2] for e in arm.errors)
        errors[kind] = {"mse": err / n if n else 0.0, "rel": (err / norm) ** 0.5 if norm else 0.0}
    train = sum(arm.train_loss[-every:]) / every
    train_ref = sum(reference.train_loss[-every:]) / every
    return {
        "keyframe_bytes": arm.stored_bytes[0],
        "delta_bytes": mean_bytes,
        "full_state_ratio": full_raw / mean_bytes,
        "bits_per_param": 8 * mean_bytes / params,
        "model_state_ratio": 4 * params / mean_weight,
        "train_loss": train,
        "train_gap_pct": 100 * (train / train_ref - 1),
        "val_loss": arm.val_loss[-1],
        "val_gap_pct": 100 * (arm.val_loss[-1] / reference.val_loss[-1] - 1),
        "errors": errors,
        "update_error_last": arm.update_errors[-1],
        "update_error_max": max(arm.update_errors),
        "seconds": arm.seconds,
    }


def markdown(rows: dict[str, dict[str, Any]], params: int, steps: int, every: int, resumes: int) -> str:
    lines = [
        f"{params:,} parameters, {steps} steps, a checkpoint every {every} steps, training resumed "
        f"from the decoded checkpoint {resumes} times per arm (``-open``: never; its losses are "
        f"the decoded checkpoints'). Ratios: raw fp32 over stored bytes, mean over the delta "
        f"checkpoints; gaps relative to the lossless arm's final loss. Error/update: the weights' "
        f"error over the update since the state training went on from, at the last delta "
        f"checkpoint (the largest in brackets).",
        "",
        "| arm | bytes/delta ckpt | full-state ratio | bits/param | model-state ratio | train loss (gap) "
        "| val loss (gap) | rel. error w / m / v | MSE w / m / v | error/update |",
        "|---|---:|---:|---:|---:|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        e = r["errors"]
        lines.append(
            f"| {name} | {r['delta_bytes']:,.0f} | {r['full_state_ratio']:.1f}x | "
            f"{r['bits_per_param']:.2f} | {r['model_state_ratio']:.1f}x | "
            f"{r['train_loss']:.4f} ({r['train_gap_pct']:+.2f}%) | "
            f"{r['val_loss']:.4f} ({r['val_gap_pct']:+.2f}%) | "
            + " / ".join(f"{e[k]['rel']:.3g}" for k in STATES) + " | "
            + " / ".join(f"{e[k]['mse']:.2g}" for k in STATES) + " | "
            + f"{r['update_error_last']:.2f} ({r['update_error_max']:.2f}) |"
        )
    return "\n".join(lines)


def plot(arms: list[Arm], params: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (losses, ratios) = plt.subplots(1, 2, figsize=(12, 4.5))
    for arm in arms:
        window = max(1, len(arm.train_loss) // 40)
        smooth = torch.tensor(arm.train_loss).unfold(0, window, window).mean(1)
        x = [(i + 0.5) * window for i in range(len(smooth))]
        line, = losses.plot(x, smooth.tolist(), label=f"{arm.name} (train)", lw=1)
        losses.plot(arm.steps, arm.val_loss, "o--", color=line.get_color(), ms=3,
                    label=f"{arm.name} (val)")
        if arm.mode != "lossless":
            ratios.plot(arm.steps[1:], [12 * params / b for b in arm.stored_bytes[1:]], "o-",
                        color=line.get_color(), label=arm.name)
    losses.set(xlabel="step", ylabel="loss",
               title="Training resumed from each decoded checkpoint (-open: never)")
    losses.legend(fontsize=7)
    ratios.set(xlabel="step", ylabel="raw fp32 full state / stored", yscale="log",
               title="Full-state ratio per delta checkpoint")
    ratios.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny model, 60 steps (the tests)")
    parser.add_argument("--steps", type=int, help="training steps (default 320; quick 60)")
    parser.add_argument("--every", type=int, help="steps between checkpoints (default 20; quick 10)")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated, from: " + ", ".join(ARMS))
    parser.add_argument("--error-budget", type=parse_error_budget,
                        help="the adaptive arm's error_budget: a number, or state=number pairs "
                             "as the CLI takes them (weight=1.5,exp_avg=0.85)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for training")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where to write the results")
    args = parser.parse_args()
    config = QUICK if args.quick else FULL
    steps = args.steps or (60 if args.quick else 320)
    every = args.every or (10 if args.quick else 20)
    names = ["lossless", *(a for a in args.arms.split(",") if a and a != "lossless")]
    unknown = [n for n in names if n not in ARMS]
    if unknown or steps < 2 * every:
        parser.error(f"unknown arms {unknown}" if unknown else "need at least two checkpoints")
    arms = [Arm(n, ARMS[n]["mode"], {k: v for k, v in ARMS[n].items() if k not in ("mode", "resume")},
                ARMS[n].get("resume", True)) for n in names]
    if args.error_budget is not None:
        for arm in arms:
            if arm.mode == "adaptive":
                arm.options["error_budget"] = args.error_budget
    torch.set_num_threads(args.threads)
    info = machine_info()
    with tempfile.TemporaryDirectory() as workdir:
        for arm in arms:
            run_arm(arm, config, steps, every, args.seed, Path(workdir))
    params = make_trainer(config, steps, args.seed).model.num_parameters()
    rows = {arm.name: summary(arm, arms[0], params, every) for arm in arms}
    table = markdown(rows, params, steps, every, steps // every - 1)
    text = "## Fidelity of the lossy modes\n\n" + info_markdown(info) + "\n\n" + table + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(arms, params, args.out / "fidelity.png")
    data = {"machine": info, "config": asdict(config), "steps": steps, "every": every,
            "rows": rows, "arms": [asdict(arm) for arm in arms]}
    write_results("fidelity", text, data, args.out)


if __name__ == "__main__":
    main()
