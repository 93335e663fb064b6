"""The small, deterministic training states behind the atheris seeds (fuzz/make_atheris_corpus.py)
and the in-memory base the harnesses pass to ``loads`` (delta and lossy seeds were coded against
it). Tensors stay tiny so that one fuzz execution is cheap."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import torch


def model(seed: int) -> dict[str, Any]:
    """A two-layer model with an Adam state: what the lossy modes expect."""
    g = torch.Generator().manual_seed(seed)
    weights = {
        "model.wte.weight": torch.randn(16, 8, generator=g) * 0.02,
        "model.fc.weight": torch.randn(8, 8, generator=g) * 0.02,
        "model.fc.bias": torch.zeros(8),
    }
    return {
        "model": {k.split(".", 1)[1]: v for k, v in weights.items()},
        "optimizer": {
            "state": {
                i: {"step": torch.tensor(float(seed)), "exp_avg": v * 0.1,
                    "exp_avg_sq": v * v + 1e-8}
                for i, v in enumerate(weights.values())
            },
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1, 2]}],
        },
        "step": seed,
    }


def base_state() -> dict[str, Any]:
    """The state every delta and lossy seed was coded against."""
    return model(1)


def next_state() -> dict[str, Any]:
    """One training step after :func:`base_state`."""
    state = model(1)
    g = torch.Generator().manual_seed(2)
    for name, w in state["model"].items():
        state["model"][name] = w + torch.randn(w.shape, generator=g) * 1e-3
    for moments in state["optimizer"]["state"].values():  # moments move too (else kept exact)
        moments["exp_avg"] = moments["exp_avg"] * 0.9 + torch.randn(moments["exp_avg"].shape,
                                                                    generator=g) * 1e-4
        moments["exp_avg_sq"] = moments["exp_avg_sq"] * 0.999 + 1e-9
    state["step"] = 2
    return state


def mixed_state() -> dict[str, Any]:
    """Every kind of leaf the tree grammar has, small."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(32, 4, generator=g)
    sd = OrderedDict(weight=w[:2].clone())
    sd._metadata = OrderedDict({"": {"version": 1}})  # type: ignore[attr-defined]
    return {
        "bf16": w.bfloat16(),
        "fp16": w[:4].half(),
        "fp64": w[:2].double(),
        "ids": torch.arange(24, dtype=torch.int32),
        "mask": torch.arange(10) % 3 == 0,
        "i8": torch.arange(-5, 5, dtype=torch.int8),
        "tied": [w, w],
        "tuple": (1, 2.5, None, True, "text", b"\x00bytes"),
        "nested": {1: {"deep": [float("inf"), complex(1, 2)]}},
        "dtype": torch.float16,
        "size": torch.Size([3, 4]),
        "empty": torch.empty(0, 3),
        "scalar": torch.tensor(7),
        "numpy": np.arange(5, dtype=np.int16),
        "np_scalar": np.float32(1.5),
        "device": torch.device("cpu"),
        "bytearray": bytearray(b"xy"),
        "view": w[1:3, ::2],  # a strided view of the "bf16" source's storage
        "state_dict": sd,
        "tuple_keys": {(1, "a"): 2, 3: None},
        "param": torch.nn.Parameter(torch.ones(3)),
        "grad": torch.ones(2, requires_grad=True),
    }
