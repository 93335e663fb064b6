"""``benchmarks/incremental_bounds.py --quick`` end to end: the residual's entropy table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_incremental_bounds_quick():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "incremental_bounds.py"),
                          "--quick"], check=True, timeout=170, capture_output=True, text=True).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines()[2:] if line.startswith("|")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        (g, d) for g in ("2", "5", "10") for d in ("fp32", "bf16")]
    for row in rows:
        order0, _, given, richer, ratios = (
            [float(x) for x in cell.split(" / ")] if cell.strip() != "-" else []
            for cell in row[2:])
        width = 4 if row[1].strip() == "fp32" else 2
        assert len(order0) == len(given) == len(richer) == width
        assert all(0 <= h <= 8 for h in order0 + given + richer)
        # refining a context never raises an empirical conditional entropy (the printed values
        # are rounded to 3 decimals)
        assert all(r <= g + 0.0015 for r, g in zip(richer, given))
        assert ratios[2] >= ratios[1] - 0.002 and min(ratios) > 1
