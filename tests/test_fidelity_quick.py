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
    # the adaptive policy's targets against ExCP, on the tiny run: 2.3x ExCP's ratio at +1.8%
    # when written (the full run: 2.16x at +0.26%)
    assert rows["adaptive"]["full_state_ratio"] >= 1.3 * rows["excp"]["full_state_ratio"]
    assert rows["adaptive"]["val_gap_pct"] < 5
    assert (tmp_path / "fidelity.png").stat().st_size > 10_000
    assert "| adaptive |" in (tmp_path / "fidelity.md").read_text()
