"""The fidelity harness end to end: ``benchmarks/fidelity.py --quick`` in a subprocess (tiny GPT,
every lossy arm, training resumed from each decoded checkpoint)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_fidelity_quick(tmp_path):
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "fidelity.py"), "--quick", "--out",
                    str(tmp_path)], check=True, timeout=170, capture_output=True)
    data = json.loads((tmp_path / "fidelity.json").read_text())
    rows = data["rows"]
    assert list(rows) == ["lossless", "excp", "bitsnap", "adaptive", "adaptive-open"]
    assert rows["lossless"]["val_gap_pct"] == 0
    for name in ("excp", "bitsnap", "adaptive"):
        assert rows[name]["full_state_ratio"] > 2 * rows["lossless"]["full_state_ratio"], name
        assert abs(rows[name]["val_gap_pct"]) < 30, name
    # the adaptive policy against ExCP, on the tiny run: 4.0x ExCP's ratio at -0.09% when written
    # (the full run: 80x, 5x ExCP); the issue asks for 1.3x
    assert rows["adaptive"]["full_state_ratio"] >= 3.0 * rows["excp"]["full_state_ratio"]
    assert rows["adaptive"]["val_gap_pct"] < 2
    assert 1.3 < rows["adaptive"]["update_error_max"] < 1.7  # the budget: 1.5 of each update
    # training went on from the true state: the chain's error stays bounded (3.2 updates at the
    # end, where the cosine schedule shrinks the updates; re-coding the base's error at a budget
    # of 1.5 would reach about 10 by the fifth delta)
    assert rows["adaptive-open"]["update_error_max"] < 5
    assert rows["adaptive-open"]["val_gap_pct"] < 1
    assert rows["adaptive-open"]["full_state_ratio"] > 20
    assert (tmp_path / "fidelity.png").stat().st_size > 10_000
    assert "| adaptive |" in (tmp_path / "fidelity.md").read_text()
