"""Every script in examples/ runs to the end, resumes bit-exactly and prints its sizes (each with
the fewest steps that still save, rotate and resume); the DeepSpeed one, whose framework is not
among the extras, skips cleanly where DeepSpeed is missing."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

CASES = {
    "plain_loop.py": (None, ["--steps", "8", "--every", "2"]),
    "hf_trainer.py": ("transformers", ["--steps", "6", "--mode", "adaptive"]),
    "lightning_fit.py": ("lightning", ["--steps", "6"]),
    "accelerate_loop.py": ("accelerate", ["--steps", "4"]),
    "deepspeed_engine.py": ("deepspeed", ["--steps", "4"]),
}
#: What an example prints when its resumed run checks out (default: "matches: True"); the HF
#: example's lossy run resumes from its keyframe, so no weight may differ there either.
EXPECTED = {"hf_trainer.py": "largest weight difference from the uninterrupted run: 0\n"}
#: Examples that run without their framework and say that they skipped.
SKIP_CLEANLY = {"deepspeed_engine.py"}


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("script", sorted(CASES))
def test_example_runs(script: str, tmp_path: Path) -> None:
    framework, arguments = CASES[script]
    missing = framework is not None and importlib.util.find_spec(framework) is None
    if missing and script not in SKIP_CLEANLY:
        pytest.skip(f"{framework} is not installed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--dir", str(tmp_path), *arguments],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    if missing:
        assert f"{framework} is not installed: skipped" in result.stdout
        return
    assert EXPECTED.get(script, "matches: True") in result.stdout
    assert "bytes" in result.stdout
