"""Write the golden .ckz files that pin format version 1 (run once per format change).

    python tests/golden/make_golden.py

Each file is committed; tests/test_golden.py checks that this ckptzip reads every one of them back
to exactly `golden_state()`. Never regenerate a file of an older format version: new versions add
new files.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).parent


def golden_state() -> dict[str, Any]:
    """A small state with one of everything, fully determined by integer arithmetic."""
    ramp = torch.arange(-600, 600, dtype=torch.int64)
    weights = (torch.sin(ramp.double() * 0.37) * 0.05).float().reshape(40, 30)
    tied = weights.bfloat16()
    model = OrderedDict(
        [("embed.weight", tied), ("head.weight", tied), ("norm.bias", torch.zeros(30, dtype=torch.float16))]
    )
    model._metadata = OrderedDict([("", {"version": 1})])  # type: ignore[attr-defined]
    return {
        "model": model,
        "optimizer": {
            "state": {0: {"step": torch.tensor(12.0), "exp_avg": weights * 0.1,
                          "exp_avg_sq": (weights * weights).double()}},
            "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999), "params": [0]}],
        },
        "fp8": torch.arange(0, 256, dtype=torch.uint8).view(torch.float8_e4m3fn),
        "flags": ramp[:50] % 3 == 0,
        "complex": torch.complex(weights[0], weights[1]),
        "scalar": torch.tensor(7, dtype=torch.int32),
        "empty": torch.empty(0, 5),
        "numpy": np.arange(12, dtype=np.uint16).reshape(3, 4),
        "bytes": b"\x00golden\xff",
        "values": [1, 2.5, float("inf"), None, True, "text", (3, 4), complex(1, 2)],
        "step": 12,
    }


def main() -> None:
    import ckptzip

    path = HERE / "v1.0-lossless.ckz"
    ckptzip.save(golden_state(), path, metadata={"golden": "v1.0"}, threads=1)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
