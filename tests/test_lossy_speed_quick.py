"""The lossy speed benchmark end to end on a small square state (``benchmarks/lossy_speed.py
--states square``), with and without ``--tune-malloc``, in subprocesses: every mode's rows, with
a save and a load time per round, ratios that order the modes as the scoreboard does, and a
device option that refuses a machine without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "lossy_speed.py"


@pytest.mark.parametrize("tuned", [False, True], ids=["glibc-defaults", "tuned"])
def test_lossy_speed_square_state(tmp_path: Path, tuned: bool) -> None:
    command = [sys.executable, str(SCRIPT), "--states", "square", "--square", "96", "--threads",
               "1,2", "--repeat", "2", "--out", str(tmp_path)] + (["--tune-malloc"] if tuned else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "lossy_speed.json").read_text())["rows"]
    assert {(r["mode"], r["threads"]) for r in rows} == {
        (m, t) for m in ("lossless", "excp", "bitsnap", "adaptive") for t in (1, 2)}
    for row in rows:
        assert row["params"] == 4 * 96 * 96 and row["raw_bytes"] == 12 * row["params"]
        assert len(row["save_s"]) == len(row["load_s"]) == len(row["load_again_s"]) == 2
        assert all(s > 0 for s in row["save_s"] + row["load_s"] + row["load_again_s"])
        assert row["transform_s"] == []  # the states lived on the host
    ratio = {r["mode"]: r["raw_bytes"] / r["stored_bytes"] for r in rows}
    assert ratio["lossless"] < ratio["bitsnap"] < ratio["excp"] < ratio["adaptive"]
    assert "| square |" in (tmp_path / "lossy_speed.md").read_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_lossy_speed_device_needs_cuda(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda", "--states", "square",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "no CUDA device" in done.stderr
