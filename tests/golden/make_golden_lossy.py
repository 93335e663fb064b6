"""Write the golden lossy files: a keyframe and one delta per lossy mode, and the bits each delta
decodes to (run once per change of what a lossy file may hold).

    python tests/golden/make_golden_lossy.py

Never regenerate a committed file: they pin what old writers stored. ``v1.0-adaptive-mark.ckz``
was written before the adaptive mode dropped its ``mark`` stage (a faint known noise on the
weights); this ckptzip must still decode it to exactly ``v1.0-adaptive-mark.expected.safetensors``.
``v1.0-adaptive-ratio.ckz`` holds a ``base-ratio`` stage (``ratio_coding=True``);
``v1.0-adaptive-step.ckz`` a ``sqrt-scale`` stage (``step_coding=True``, its default since
ckptzip's session 22) as well. ``v1.0-adaptive-filled.ckz`` a ``base-ratio-filled`` stage (session
24): its base's second moment is zero in every fifth row, where the delta's is not; it was
written before the ``base-partition`` stage, which ``v1.0-adaptive-partition.ckz`` (a larger
model whose base's second moment is zero in half its rows) adds after the codebook.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent / "lossy"


def golden_chain(rows: int = 64, columns: int = 48) -> tuple[dict[str, object], dict[str, object]]:
    """Two consecutive training states of a tiny model with AdamW moments, fully determined by
    integer arithmetic."""
    ramp = torch.arange(0, rows * columns, dtype=torch.int64).double()
    weight = (torch.sin(ramp * 0.37) * 0.05).float().reshape(rows, columns)
    update = (torch.cos(ramp * 0.11) * 1e-3).float().reshape(rows, columns)
    bias = (torch.sin(ramp[:columns] * 0.5) * 0.01).float()

    def state(step: int, w: torch.Tensor) -> dict[str, object]:
        m = update * (0.9 + 0.01 * step)
        v = update * update * (1.5 + 0.1 * step) + 1e-10
        return {
            "model": {"layer.weight": w, "layer.bias": bias},
            "optimizer": {
                "state": {0: {"step": torch.tensor(float(step)), "exp_avg": m, "exp_avg_sq": v}},
                "param_groups": [{"lr": 1e-3, "params": [0]}],
            },
        }

    return state(10, weight), state(20, weight + update * 3)


def filled_chain(partition: bool = False) -> tuple[dict[str, object], dict[str, object]]:
    """:func:`golden_chain` with the first state's second moment zero in every fifth row (an
    embedding's tokens not yet seen), the second's not (seen since). ``partition``: 128 x 64,
    the first state's second moment zero in every other row and the second's in every fourth,
    a zero pattern worth the ``base-partition`` stage (``PARTITION_MIN_BYTES``)."""
    first, second = golden_chain(128, 64) if partition else golden_chain()
    zeroed = ((first, slice(None, None, 2)), (second, slice(None, None, 4))) if partition else (
        (first, slice(None, None, 5)),)
    for state, rows in zeroed:
        moments = state["optimizer"]["state"][0]  # type: ignore[index]
        moments["exp_avg_sq"] = moments["exp_avg_sq"].clone()
        moments["exp_avg_sq"][rows] = 0
    return first, second


def main(mode: str) -> None:
    import ckptzip

    first, second = (filled_chain() if mode == "adaptive-filled"
                     else filled_chain(partition=True) if mode == "adaptive-partition"
                     else golden_chain())
    HERE.mkdir(exist_ok=True)
    base = HERE / f"v1.0-{mode}-base.ckz"
    delta = HERE / f"v1.0-{mode}.ckz"
    ckptzip.save(first, base, threads=1)
    # adaptive-ratio: the second moment as its ratio to the base's (the base-ratio stage), the
    # first as itself; adaptive-step: the first as Adam's step too (the sqrt-scale stage)
    options: dict[str, object] = {
        "adaptive-ratio": {"ratio_coding": True, "joint_restart": False, "step_coding": False},
        "adaptive-step": {"ratio_coding": True, "joint_restart": False, "step_coding": True},
        "adaptive-filled": {"ratio_coding": True, "joint_restart": False, "step_coding": True},
        "adaptive-partition": {"ratio_coding": True, "joint_restart": False, "step_coding": True},
    }.get(mode, {})
    ckptzip.save(second, delta, mode=mode.split("-")[0], base=base, threads=1, **options)
    decoded = ckptzip.load(delta)
    tensors = {"layer.weight": decoded["model"]["layer.weight"],
               "exp_avg": decoded["optimizer"]["state"][0]["exp_avg"],
               "exp_avg_sq": decoded["optimizer"]["state"][0]["exp_avg_sq"]}
    from safetensors.torch import save_file

    save_file(tensors, str(HERE / f"v1.0-{mode}.expected.safetensors"))
    print(f"wrote {delta} ({delta.stat().st_size} bytes) and its expected decode")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "adaptive-mark")
