"""`ckptzip demo`: train a small GPT, checkpoint it with ckptzip, resume once, and report."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import ckptzip
from ckptzip.demo.datasets import flat_tensors
from ckptzip.demo.train import CONFIGS, Trainer, evaluate, load_data, make_trainer, same_state
from ckptzip.progress import Progress

RESUME_CHECK_STEPS = 10
VAL_BATCHES = 10


@dataclass
class Row:
    """One checkpoint's line in the final table."""

    step: int
    raw_bytes: int
    stored_bytes: int
    save_seconds: float
    load_seconds: float
    zstd_ratio: float | None
    exact: bool
    #: "key" for a standalone checkpoint, "delta" for one coded against the one before it.
    kind: str = ""


@dataclass
class ResumeCheck:
    """Result of resuming from a loaded checkpoint beside the uninterrupted run."""

    step: int
    losses: list[float]
    exact: bool


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ckptzip demo",
        description="Train a small GPT on the Python standard library's source, checkpoint it "
        "with ckptzip every few steps, resume once from a checkpoint, and compare with zstd. "
        "The defaults take about 6 minutes on 2 idle CPU cores (about 1 step/s, and the lossy "
        "chain's saves).",
    )
    parser.add_argument("--steps", type=_positive, default=240, help="training steps (240)")
    parser.add_argument("--every", type=_positive, default=40, help="checkpoint interval (40)")
    parser.add_argument("--keyframe-every", type=_positive, default=4, metavar="K",
                        help="incremental checkpoints: each is coded against the one before it, "
                             "with a standalone keyframe every K (4; 1 = no deltas)")
    parser.add_argument("--out", metavar="DIR",
                        help="checkpoint folder (a fresh temp folder, kept: the run says where)")
    parser.add_argument("-T", "--threads", type=_positive, help="torch and ckptzip threads")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="small", help="model size")
    parser.add_argument("--seed", type=int, default=0, help="seed of the run (0)")
    parser.add_argument("--lossy", choices=("adaptive", "excp", "bitsnap", "none"), default="adaptive",
                        help="also save every checkpoint as a chain in this lossy mode, beside the "
                             "lossless ones (in DIR/<mode>/), and report its ratio and the "
                             "validation loss of its last checkpoint as decoded (adaptive)")
    return parser.parse_args(argv)


@dataclass
class LossyChain:
    """The lossy chain saved beside the lossless checkpoints, while training goes on from the
    true state (as it does when nothing fails)."""

    mode: str
    steps: list[int] = field(default_factory=list)
    raw_bytes: list[int] = field(default_factory=list)
    stored_bytes: list[int] = field(default_factory=list)
    save_seconds: float = 0.0
    #: The last checkpoint, as decoded.
    last: dict[str, Any] | None = None

    def summary(self, val_true: float, val_decoded: float) -> str:
        deltas = self.stored_bytes[1:]
        if not deltas:
            return f"{self.mode} chain: a keyframe only (no deltas to report)"
        ratio = sum(self.raw_bytes[1:]) / sum(deltas)
        return (f"{self.mode} chain (lossy; training went on from the true state): keyframe "
                f"{_mb(self.stored_bytes[0])} MB, {len(deltas)} deltas of "
                f"{_mb(sum(deltas) // len(deltas))} MB on average = {ratio:.1f}x the raw state; "
                f"saves {self.save_seconds:.1f}s in all; the last checkpoint as decoded: val loss "
                f"{val_decoded:.4f} ({100 * (val_decoded / val_true - 1):+.2f}% against the true "
                f"state's)")


def zstd_ratio(state: dict[str, Any]) -> float | None:
    """zstd level 3 on the state's tensor bytes (each storage once); None without `zstandard`."""
    try:
        import zstandard
    except ImportError:
        return None
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    raw = stored = 0
    seen: set[tuple[int, int]] = set()
    for t in flat_tensors(state).values():
        if (t.data_ptr(), t.nbytes) in seen:
            continue
        seen.add((t.data_ptr(), t.nbytes))
        data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().data
        raw += data.nbytes
        stored += len(compressor.compress(data))
    stored += len(compressor.flush())
    return raw / stored if stored else None


def check_resume(
    trainer: Trainer,
    loaded: dict[str, Any],
    data: torch.Tensor,
    steps: int,
    total_steps: int,
    seed: int,
) -> tuple[Trainer, ResumeCheck]:
    """Train `steps` more steps uninterrupted, and again from `loaded` in fresh objects.

    Returns the resumed trainer, which the run continues with, and whether both agree bit for
    bit (losses and the whole state). The fresh objects get another seed, so that only the
    checkpoint can make them agree.
    """
    step = trainer.step
    reference_losses = trainer.train(data, steps)
    resumed = make_trainer(trainer.config, total_steps, seed + 1)
    resumed.restore(loaded)
    resumed_losses = resumed.train(data, steps)
    exact = resumed_losses == reference_losses and same_state(resumed.state(), trainer.state())
    return resumed, ResumeCheck(step, resumed_losses, exact)


def save_lossy(chain: LossyChain, state: dict[str, Any], out: Path, step: int,
               threads: int | None, *, last: bool) -> None:
    """Save ``state`` into ``chain`` (its first checkpoint a lossless keyframe, then deltas, each
    against the one before); keep the last one as decoded."""
    folder = out / chain.mode
    folder.mkdir(exist_ok=True)
    path = folder / f"step-{step:06d}.ckz"
    previous = folder / f"step-{chain.steps[-1]:06d}.ckz" if chain.steps else None
    report = ckptzip.save(state, path, mode=chain.mode, base=previous, threads=threads)
    chain.steps.append(step)
    chain.raw_bytes.append(report.raw_bytes)
    chain.stored_bytes.append(report.stored_bytes)
    chain.save_seconds += report.seconds
    if last:
        chain.last = ckptzip.load(path, threads=threads)


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f}"


def format_table(rows: list[Row]) -> str:
    """The per-checkpoint table with a totals row."""
    header = ("step", "kind", "raw MB", "stored MB", "ratio", "save s", "load s", "zstd-3", "exact")
    lines = [header]
    for r in [*rows, _totals(rows)]:
        lines.append(
            (
                str(r.step) if r.step >= 0 else "total",
                r.kind,
                _mb(r.raw_bytes),
                _mb(r.stored_bytes),
                f"{r.raw_bytes / r.stored_bytes:.3f}x",
                f"{r.save_seconds:.2f}",
                f"{r.load_seconds:.2f}",
                "n/a" if r.zstd_ratio is None else f"{r.zstd_ratio:.3f}x",
                "yes" if r.exact else "NO",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines)


def _totals(rows: list[Row]) -> Row:
    """Sums over all checkpoints (step -1 marks the row); zstd weighted by raw size."""
    raw = sum(r.raw_bytes for r in rows)
    zstd_stored = [r.raw_bytes / r.zstd_ratio for r in rows if r.zstd_ratio is not None]
    return Row(
        step=-1,
        raw_bytes=raw,
        stored_bytes=sum(r.stored_bytes for r in rows),
        save_seconds=sum(r.save_seconds for r in rows),
        load_seconds=sum(r.load_seconds for r in rows),
        zstd_ratio=raw / sum(zstd_stored) if len(zstd_stored) == len(rows) else None,
        exact=all(r.exact for r in rows),
    )


def checkpoint_steps(steps: int, every: int) -> list[int]:
    """Every `every` steps, and at the end."""
    return sorted({*range(every, steps + 1, every), steps})


def resume_step(checkpoints: list[int], steps: int) -> int | None:
    """The checkpoint to resume from: the last one at or before half way, else the first one;
    None when no training follows any checkpoint."""
    candidates = [s for s in checkpoints if s < steps]
    if not candidates:
        return None
    halfway = [s for s in candidates if s <= steps // 2]
    return halfway[-1] if halfway else candidates[0]


def main(argv: list[str] | None = None) -> int:
    """Run the demo; returns 0 when every checkpoint round-trips and the resume is exact."""
    args = parse_args(argv)
    # on a terminal, a bar for the training steps between the checkpoint lines (none when piped)
    bar = Progress(args.steps, "training", enabled=not args.quiet, unit="steps")
    say = (lambda _msg: None) if args.quiet else bar.write
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = CONFIGS[args.config]
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="ckptzip-demo-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"checkpoints in {out}")

    start = time.perf_counter()
    train_data, val_data = load_data(config)
    trainer = make_trainer(config, args.steps, args.seed)
    say(
        f"model: {args.config}, {trainer.model.num_parameters() / 1e6:.1f}M parameters; "
        f"{args.steps} steps of {config.batch_size}x{config.model.block_size} bytes; "
        f"{torch.get_num_threads()} threads"
    )
    checkpoints = checkpoint_steps(args.steps, args.every)
    resume_at = resume_step(checkpoints, args.steps)
    rows: list[Row] = []
    losses: list[float] = []
    resume: ResumeCheck | None = None
    previous: Path | None = None
    lossy = None if args.lossy == "none" else LossyChain(args.lossy)
    for i, target in enumerate(checkpoints):
        losses += trainer.train(train_data, target - trainer.step,
                                on_step=lambda step, _loss: bar.set(step))
        state = trainer.state()
        path = out / f"step-{target:06d}.ckz"
        report = ckptzip.save(state, path, base=previous, keyframe_every=args.keyframe_every,
                              threads=args.threads)
        previous = path
        with ckptzip.open(path) as written:
            kind = "delta" if written.chain_depth else "key"
        t0 = time.perf_counter()
        loaded = ckptzip.load(path, threads=args.threads)
        load_seconds = time.perf_counter() - t0
        row = Row(
            step=target,
            raw_bytes=report.raw_bytes,
            stored_bytes=report.stored_bytes,
            save_seconds=report.seconds,
            load_seconds=load_seconds,
            zstd_ratio=zstd_ratio(state),
            exact=same_state(loaded, state),
            kind=kind,
        )
        rows.append(row)
        if lossy is not None:
            save_lossy(lossy, state, out, target, args.threads, last=target == checkpoints[-1])
        say(
            f"step {target:>{len(str(args.steps))}}/{args.steps}  loss {losses[-1]:.4f}  {kind:<5} "
            f"{_mb(row.raw_bytes)} MB -> {_mb(row.stored_bytes)} MB "
            f"({report.ratio:.3f}x) save {row.save_seconds:.2f}s load {load_seconds:.2f}s  "
            f"[{time.perf_counter() - start:.0f}s]"
        )
        if target == resume_at:
            steps = min(RESUME_CHECK_STEPS, checkpoints[i + 1] - target)  # stay before the next save
            trainer, resume = check_resume(trainer, loaded, train_data, steps, args.steps, args.seed)
            losses += resume.losses
            bar.set(trainer.step)
            say(f"resumed from {path.name}: {'exact' if resume.exact else 'NOT exact'}")

    bar.close()
    block = config.model.block_size
    val_loss = evaluate(trainer.model, val_data, VAL_BATCHES, config.batch_size, block)
    tail = losses[-10:]
    print()
    print(format_table(rows))
    print()
    print(f"final train loss {sum(tail) / len(tail):.4f} (mean of the last {len(tail)} steps)")
    print(f"final val loss   {val_loss:.4f} ({VAL_BATCHES} batches)")
    if resume is None:
        print("resume: not checked (no training after the first checkpoint)")
    else:
        verdict = "exact" if resume.exact else "NOT exact"
        print(
            f"resume from step {resume.step} via ckptzip.load: {verdict} "
            f"(next {len(resume.losses)} losses and the full state, bit for bit)"
        )
    if lossy is not None and lossy.last is not None:
        trainer.restore(lossy.last)
        decoded = evaluate(trainer.model, val_data, VAL_BATCHES, config.batch_size, block)
        print(lossy.summary(val_loss, decoded))
    print(f"wall time {time.perf_counter() - start:.1f}s")
    if not args.out:  # a directory of our own in the temporary one: say what it holds
        kept = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
        print(f"checkpoints kept in {out} ({kept / 1e6:.0f} MB): remove it when done "
              f"(rm -r {out}), or pass --out DIR to choose where they go")
    ok = all(r.exact for r in rows) and (resume is None or resume.exact)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
