"""benchmarks/hf_trainer.py end to end with ``--quick`` (a tiny GPT-2 on random tokens), in a
subprocess: every arm trains the same steps, the ckptzip arms' decoded last checkpoint gives the
trained model's loss (lossless) or near it (adaptive), and the adaptive deltas are the smallest."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "hf_trainer.py"


def test_hf_trainer_benchmark_quick(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    command = [sys.executable, str(SCRIPT), "--quick", "--steps", "8", "--every", "2",
               "--work", str(tmp_path / "work"), "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["arm"]: r for r in json.loads((tmp_path / "hf_trainer-quick.json").read_text())["results"]}
    assert list(results) == ["hf", "lossless", "lossless-deltas", "adaptive",
                             "lossless-deltas-unheld", "adaptive-unheld"]
    for arm in ("lossless-deltas", "adaptive"):  # held as decoded or not: the same files
        unheld = results[f"{arm}-unheld"]
        assert unheld["state_bytes"] == results[arm]["state_bytes"]
        assert unheld["val_loss_decoded_last"] == results[arm]["val_loss_decoded_last"]
    for r in results.values():
        assert r["checkpoints"] == 4 and len(r["save_seconds"]) == 4
        assert r["val_loss_trained"] == results["hf"]["val_loss_trained"]  # the same training
    for arm in ("hf", "lossless", "lossless-deltas"):  # bit-exact checkpoints
        assert results[arm]["val_loss_decoded_last"] == results[arm]["val_loss_trained"]
    assert results["lossless"]["delta"] == [False] * 4  # standalone; the others: deltas after a keyframe
    assert results["lossless-deltas"]["delta"] == results["adaptive"]["delta"] == [False, True, True, True]
    adaptive = results["adaptive"]
    assert abs(adaptive["val_loss_decoded_last"] / adaptive["val_loss_trained"] - 1) < 0.01
    later = {arm: sum(r["state_bytes"][1:]) for arm, r in results.items() if "unheld" not in arm}
    assert later["adaptive"] < later["lossless-deltas"] < later["lossless"] < later["hf"]
    assert "| adaptive |" in (tmp_path / "hf_trainer-quick.md").read_text()
