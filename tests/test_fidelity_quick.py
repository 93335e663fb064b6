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
    assert list(rows) == ["lossless", "excp", "bitsnap", "adaptive"]
    assert rows["lossless"]["val_gap_pct"] == 0
    for name in ("excp", "bitsnap", "adaptive"):
        assert rows[name]["full_state_ratio"] > 2 * rows["lossless"]["full_state_ratio"], name
        assert abs(rows[name]["val_gap_pct"]) < 30, name
    # the adaptive policy against ExCP, on the tiny run: 3.4x ExCP's ratio at +0.64% when written
    # (the full run: 58.1x, 3.6x ExCP, at -0.64%); the issue asks for 1.3x
    assert rows["adaptive"]["full_state_ratio"] >= 3.0 * rows["excp"]["full_state_ratio"]
    assert rows["adaptive"]["val_gap_pct"] < 2
    assert (tmp_path / "fidelity.png").stat().st_size > 10_000
    assert "| adaptive |" in (tmp_path / "fidelity.md").read_text()
