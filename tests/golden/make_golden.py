"""Write the golden .ckz files that pin format version 1 (run once per format change).

    python tests/golden/make_golden.py [DIR]      # default: beside this script

- `v1.0-lossless.ckz`: `golden_state()` saved by the writer, its header deflated (flag bit 0).
- `v1.0-lossless-plain-header.ckz`: the same header and data section, the header stored as plain
  JSON (flags 0) and padded with spaces to 4095 bytes, the room the file writer reserved for it
  before headers were deflated: the form every file had then.
- `v1.0-lossless-small-rans.ckz`: `golden_state()` as the writer coded it from session 23, where
  rANS segments of fewer than 4096 symbols take the four-stream layout (docs/STREAMS.md).
- `v1.0-lossless-header6.ckz`: the same as the writer stores it since session 30, its header
  deflated at zlib's level 6 (`container.HEADER_DEFLATE_LEVEL`) instead of 9; the header's JSON
  and the data section are those of the file before.

Each file is committed; tests/test_golden.py checks that this ckptzip reads every one of them back
to exactly `golden_state()`, and that this script still writes the current writer's files byte for
byte. Files an earlier writer wrote (:data:`EARLIER_WRITERS`) stay as they were committed: they pin
what readers must keep reading. Never regenerate a committed file: a writer whose output moves adds
files.
"""

from __future__ import annotations

import struct
import sys
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


#: The stored header of `v1.0-lossless-plain-header.ckz`: plain JSON padded to this many bytes.
PLAIN_HEADER_BYTES = 4095


def plain_header(blob: bytes, size: int = PLAIN_HEADER_BYTES) -> bytes:
    """``blob`` (a .ckz) with its header stored as plain JSON padded with spaces to ``size``
    bytes, and flags 0; the data section is kept as it is."""
    from ckptzip.container import PRELUDE_SIZE, load_header, pack_prelude

    flags, length = struct.unpack_from("<IQ", blob, 12)
    header = load_header(blob[PRELUDE_SIZE : PRELUDE_SIZE + length], flags, "<golden>")
    padded = header.rstrip(b" ").ljust(size, b" ")
    if len(padded) != size:
        raise ValueError(f"the header is {len(header)} bytes, over the {size} bytes of room")
    return pack_prelude(padded, 0) + padded + blob[PRELUDE_SIZE + length :]


#: Golden files of format version 1 that an earlier writer wrote (session 22 and before: every
#: rANS segment RANS32; sessions 23-29: the header deflated at level 9), kept byte for byte as
#: committed; this script no longer writes them.
EARLIER_WRITERS = ("v1.0-lossless.ckz", "v1.0-lossless-plain-header.ckz",
                   "v1.0-lossless-small-rans.ckz")


def golden_files() -> dict[str, bytes]:
    """The golden files of format version 1 that this ckptzip writes, by name."""
    import ckptzip

    blob = ckptzip.dumps(golden_state(), metadata={"golden": "v1.0"}, threads=1)
    return {"v1.0-lossless-header6.ckz": blob}


def main(argv: list[str]) -> None:
    out = Path(argv[0]) if argv else HERE
    for name, blob in golden_files().items():
        (out / name).write_bytes(blob)
        print(f"wrote {out / name} ({len(blob)} bytes)")


if __name__ == "__main__":
    main(sys.argv[1:])
