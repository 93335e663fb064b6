"""Every script in examples/ runs to the end, resumes bit-exactly and prints its sizes (each with
the fewest steps that still save, rotate and resume)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

CASES = {
    "plain_loop.py": (None, ["--steps", "8", "--every", "2"]),
    "hf_trainer.py": ("transformers", ["--steps", "6"]),
    "lightning_fit.py": ("lightning", ["--steps", "6"]),
    "accelerate_loop.py": ("accelerate", ["--steps", "4"]),
}


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("script", sorted(CASES))
def test_example_runs(script: str, tmp_path: Path) -> None:
    framework, arguments = CASES[script]
    if framework is not None:
        pytest.importorskip(framework)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--dir", str(tmp_path), *arguments],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "matches: True" in result.stdout
    assert "bytes" in result.stdout
