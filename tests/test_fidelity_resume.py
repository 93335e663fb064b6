"""An arm of the fidelity matrix stopped mid-chain (a GPU lease's call ends while it runs) picks
up where it stopped, and ends with the figures of an arm that ran through: the tiny GPT's
adaptive arm, once without a stop and once stopped before its third delta checkpoint, then run
again."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, {benchmarks!r})
import fidelity

class Stopped(Exception):
    pass

job = fidelity.Job(fidelity.QUICK.name, 0, fidelity.DEFAULT_ARMS[1])
through, stopped = Path({through!r}), Path({stopped!r})
whole = fidelity.run_job(job, through, quick=True)

save = fidelity.ckptzip.save
def stop_at_third(state, path, **options):
    if Path(path).name.endswith("-03.ckz"):
        raise Stopped
    return save(state, path, **options)
fidelity.ckptzip.save = stop_at_third
try:
    fidelity.run_job(job, stopped, quick=True)
except Stopped:
    pass
fidelity.ckptzip.save = save
progress = json.loads(fidelity.progress_path(job, stopped).read_text())
resumed = fidelity.run_job(job, stopped, quick=True)
left = sorted(p.name for p in stopped.iterdir() if "adaptive" in p.name)
print(json.dumps({{"whole": whole, "resumed": resumed, "progress": progress, "left": left}}))
"""


def test_a_stopped_arm_resumes_to_the_same_figures(tmp_path):
    through, stopped = tmp_path / "through", tmp_path / "stopped"
    through.mkdir()
    stopped.mkdir()
    script = SCRIPT.format(benchmarks=str(REPO / "benchmarks"), through=str(through),
                           stopped=str(stopped))
    out = subprocess.run([sys.executable, "-c", script], check=True, timeout=170,
                         capture_output=True, text=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    whole, resumed, progress = result["whole"], result["resumed"], result["progress"]
    # the stopped process had recorded its two checkpoints
    assert len(progress["chain"]) == 2 and len(progress["stored"]) == 2
    assert progress["resumes"] == 0
    assert resumed["resumes"] == 1 and whole["resumes"] == 0
    # the same training, the same files: every figure but the clock
    for name in ("val_loss", "train_loss_last", "stored_bytes", "frozen_bytes",
                 "full_state_ratio", "model_state_ratio", "weights_kept", "moments_kept",
                 "keyframe_val_loss", "options"):
        assert resumed[name] == whole[name], name
    assert len(resumed["stored_bytes"]) == 10
    # the chain and the progress file are gone once the arm ends
    assert result["left"] == []
