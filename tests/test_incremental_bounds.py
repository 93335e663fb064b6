"""The incremental benchmarks end to end: `incremental_bounds.py --quick` (the residual's entropy
table) and `incremental.py --quick` (its tables, and `--core`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_incremental_bounds_quick():
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "probes" / "incremental_bounds.py"),
                          "--quick"], check=True, timeout=170, capture_output=True, text=True).stdout
    bounds, predictions, joint = out.strip().split("\n\n")
    rows = [line.split("|")[1:-1] for line in bounds.splitlines()[2:] if line.startswith("|")]
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
    # the moments' fits: the update's bits above its noise floor, before and after each fit
    fits = [line.split("|")[1:-1] for line in predictions.splitlines()[2:]]
    assert [r[0].strip() for r in fits] == ["2", "5", "10"]
    for row in fits:
        update = float(row[1])
        after = [float(cell.split()[0]) for cell in row[2:]]
        changes = [float(cell.split()[1].strip("()")) for cell in row[2:]]
        assert 0 < update < 32 and len(after) == 4
        assert all(abs(a - update - c) < 0.011 and a < update + 1 for a, c in zip(after, changes))
    # one symbol per element with escapes: its bits add up and stay near the two planes'
    rows = [line.split("|")[1:-1] for line in joint.splitlines()[2:]]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        (g, d) for g in ("2", "5", "10") for d in ("bf16", "fp32")]
    for row in rows:
        apart = float(row[3])
        symbol, side, total = (float(x) for x in row[4].replace("=", "+").split("+"))
        assert abs(symbol + side - total) < 0.0015 and 0 < symbol < 8 and side >= 0
        assert 0.9 * apart < total < 1.1 * apart


def test_incremental_benchmark_quick(tmp_path: Path):
    """``benchmarks/incremental.py --quick``: every interval and data set has a dense and a delta
    row (decoded bit-exactly inside), and the delta of a short interval is the smaller."""
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "incremental.py"), "--quick",
                    "--out", str(tmp_path)], check=True, timeout=300, capture_output=True)
    import json

    rows = json.loads((tmp_path / "incremental.json").read_text())["rows"]
    by_key = {(r["data"], r["interval"], r["tool"]): r for r in rows}
    for data in ("weights fp32", "weights bf16", "full state"):
        for interval in (2, 5, 10):
            dense = by_key[(data, interval, "ckptzip dense")]
            delta = by_key[(data, interval, "ckptzip delta")]
            assert dense["raw_bytes"] == delta["raw_bytes"] > 0
            assert min(dense["compress_mbps"], delta["decompress_mbps"]) > 0
            if data.startswith("weights") and interval == 2:
                assert delta["ratio"] > 1.1 * dense["ratio"]
                assert "float-diff+buckets" in delta["picks"]


def test_incremental_core_quick():
    """``--core``: both chunk coders on every interval and dtype, the delta smaller."""
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "incremental.py"), "--core",
                          "--quick", "--repeat", "1"], check=True, timeout=300, capture_output=True,
                         text=True).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| fp") or
            line.startswith("| bf")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        (d, g) for g in ("2", "5", "10") for d in ("fp32", "bf16")]
    for row in rows:
        dense_ratio, delta_ratio = (float(x) for x in row[5].split(" / "))
        assert delta_ratio > dense_ratio > 1
    for row in rows:
        for column in (row[6], row[7]):  # the difference and the XOR in plain byte planes
            ratio, speeds = column.split(", ")
            assert float(ratio) > 1
            assert all(float(x) > 0 for x in speeds.split(" / "))


def test_ab_builds_quick():
    """``benchmarks/tools/ab_builds.py``: one build against itself writes the same streams and bytes
    in every row, with speeds for both."""
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tools" / "ab_builds.py"),
                          str(REPO / "src"), str(REPO / "src"), "--quick", "--rounds", "1",
                          "--repeat", "1"], check=True, timeout=300, capture_output=True,
                         text=True).stdout
    rows = [line.split("|")[1:-1] for line in out.splitlines()
            if line.startswith("| fp") or line.startswith("| bf")]
    assert [r[0].strip() for r in rows] == ["fp32 2", "fp32 10", "fp32 dense", "bf16 2",
                                            "bf16 10", "bf16 dense"]
    for row in rows:
        before, after = row[3].split(" -> ")
        assert int(before) == int(after) > 0
        assert row[4].strip() == "same"
        for column in (row[1], row[2]):
            assert float(column.split(" -> ")[0]) > 0


def test_profile_chunks_quick():
    """``benchmarks/tools/profile_chunks.py``: the loop's speed for a delta row and the dense one, an
    interval the data lacks refused by name; under perf (where installed) a table of functions
    whose times per element add up to at most the loop's."""
    script = str(REPO / "benchmarks" / "tools" / "profile_chunks.py")
    for row, op in ((["bf16", "10"], "decode"), (["fp32", "0"], "encode")):
        out = subprocess.run([sys.executable, script, *row, "--op", op, "--quick", "--seconds",
                              "0.2"], check=True, timeout=170, capture_output=True, text=True)
        head = out.stdout.strip().splitlines()[0]
        assert head.startswith(f"{row[0]} {row[1]} {op}: ") and "ns per element" in head
        assert float(head.split(": ")[1].split()[0]) > 0
    bad = subprocess.run([sys.executable, script, "bf16", "7", "--quick"], timeout=170,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "no bf16 weights 7 steps on" in bad.stderr
    if shutil.which("perf") is None:
        return
    out = subprocess.run([sys.executable, script, "bf16", "10", "--quick", "--seconds", "1",
                          "--perf"], timeout=170, capture_output=True, text=True)
    if out.returncode and "perf record failed" in out.stderr:  # no perf_event access here
        return
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    loop_ns = float(lines[0].split(", ")[1].split()[0])
    rows = [line.split("|")[1:-1] for line in lines[3:]]
    assert rows and all(len(r) == 3 for r in rows)
    assert sum(float(r[2]) for r in rows) <= loop_ns * 1.001
