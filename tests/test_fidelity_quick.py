"""The fidelity matrix end to end: ``benchmarks/fidelity.py --quick`` in a subprocess (the tiny
GPT, two seeds of the default arms, one sweep point per ExCP and BitSnap, training resumed from
each of 10 decoded checkpoints), and its report: gaps paired per seed, the lossless arm's noise
floor, ratio-against-gap curves, ExCP's fair arm."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ckptzip.modes.bitsnap import BitsnapPolicy

REPO = Path(__file__).resolve().parent.parent


def test_fidelity_quick(tmp_path):
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "fidelity.py"), "--quick", "--out",
                    str(tmp_path)], check=True, timeout=170, capture_output=True)
    data = json.loads((tmp_path / "fidelity-matrix.json").read_text())
    assert data["not_run"] == []
    summary = data["summary"]["tiny-b095"]
    arms = summary["arms"]
    bitsnap = f"bitsnap-d{BitsnapPolicy().density:g}"  # the mode's default, at every seed
    assert list(arms)[:6] == ["lossless", "adaptive", "excp", "excp-fair", bitsnap, "excp-s1"]
    assert len(arms) == 7 and list(arms)[6].startswith("bitsnap-d")  # a sweep point
    for name in ("lossless", "adaptive", "excp", "excp-fair", bitsnap):
        assert arms[name]["seeds"] == [0, 1], name
    # paired gaps: the lossless arm against itself is exactly 0 at every seed
    assert arms["lossless"]["gaps_pct"] == [0.0, 0.0]
    # the noise floor is the lossless arm's own spread across seeds, and decides "within noise"
    vals = summary["lossless_val"]
    assert summary["noise_floor_pct"] == 100 * (max(vals) - min(vals)) / (sum(vals) / len(vals))
    assert summary["noise_floor_pct"] > 0
    for name, arm in arms.items():
        assert arm["within_noise"] == all(abs(g) <= summary["noise_floor_pct"]
                                          for g in arm["gaps_pct"]), name
    lossless = arms["lossless"]["full_state_ratio"]
    assert 1.1 < lossless < 2
    assert arms["lossless"]["weights_kept"] > 0.999  # (an element a step leaves alone is rare)
    for name in ("adaptive", "excp", "excp-fair"):
        assert arms[name]["full_state_ratio"] > 2 * lossless, name
    assert arms[bitsnap]["full_state_ratio"] > 1.5 * lossless  # density 1: fp16 deltas
    for name in ("adaptive", "excp", "excp-fair", bitsnap):
        assert arms[name]["gap_mean_pct"] < 60, name  # tiny, early training: gaps are large
    # ExCP's fair arm prunes at the cap (2.5 x the median update) on every tensor, keeping about
    # a tenth of the weight updates, where the published alpha barely prunes on this model
    assert arms["excp-fair"]["excp_strength"] == 2.5
    assert arms["excp"]["excp_strength"] < 0.5
    assert arms["excp-fair"]["weights_kept"] < 0.2 < 0.8 < arms["excp"]["weights_kept"]
    assert arms["excp-fair"]["full_state_ratio"] > 2 * arms["excp"]["full_state_ratio"]
    # the adaptive policy stores fewer bytes than published ExCP (3.4x when written)
    assert arms["adaptive"]["full_state_ratio"] > 2 * arms["excp"]["full_state_ratio"]
    # BitSnap keeps every moment (8-bit k-means): its ratio is bounded by the moments' cost
    assert arms[bitsnap]["moments_kept"] > 0.999
    assert arms[bitsnap]["full_state_ratio"] < 8
    assert (tmp_path / "fidelity-tiny-b095.png").stat().st_size > 10_000
    text = (tmp_path / "fidelity-matrix.md").read_text()
    assert "noise floor" in text and "| excp-fair |" in text and "Every run trained on the CPU" in text
