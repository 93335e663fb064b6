"""benchmarks/lightning_fit.py end to end with ``--quick`` (a tiny GPT-2 on random tokens), in a
subprocess: every arm trains the same steps, the bit-exact arms' decoded last checkpoint gives the
trained model's loss and the adaptive one's is near it, and the adaptive deltas are the smallest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "lightning_fit.py"


def test_lightning_benchmark_quick(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    command = [sys.executable, str(SCRIPT), "--quick", "--steps", "8", "--every", "2",
               "--work", str(tmp_path / "work"), "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    written = json.loads((tmp_path / "lightning_fit-quick.json").read_text())
    results = {r["arm"]: r for r in written["results"]}
    assert list(results) == ["lightning", "ckptzip-io", "lossless-deltas", "adaptive", "none"]
    assert results.pop("none")["files"] == []
    for r in results.values():
        assert len(r["files"]) == 4 and len(r["stall_seconds"]) == 4
        assert r["val_loss_trained"] == results["lightning"]["val_loss_trained"]  # the same training
    for arm in ("lightning", "ckptzip-io", "lossless-deltas"):  # bit-exact checkpoints
        assert results[arm]["val_loss_decoded_last"] == results[arm]["val_loss_trained"]
    adaptive = results["adaptive"]
    assert abs(adaptive["val_loss_decoded_last"] / adaptive["val_loss_trained"] - 1) < 0.01
    later = {arm: sum(r["file_bytes"][1:]) for arm, r in results.items()}
    assert later["adaptive"] < later["lossless-deltas"] < later["ckptzip-io"] < later["lightning"]
    assert results["adaptive"]["files"][-1] == "step-00000008.ckz"
    assert results["adaptive"]["delta"] == [False, True, True, True]  # a keyframe, then deltas
    assert results["ckptzip-io"]["delta"] == [False] * 4
