"""A/B in one process: the HF adaptive-delta arm with the held checkpoint's decode in the
background (this tree) against the same decode on the training thread (the code before f1b3893),
alternating, N rounds; per-delta _save_checkpoint seconds."""
import sys, statistics, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import hf_trainer
import ckptzip.integrations.hf as hf
from ckptzip.held import hold_written
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
TASK = hf_trainer.minilm_task()
background = hf.hold_written_soon
def on_thread(location, given, previous, *, threads=None, storage_options=None):
    return hold_written(location, given, previous, copy=True, threads=threads, storage_options=storage_options)
res = {"background": [], "training thread": []}
for r in range(rounds):
    for label in ("training thread", "background") if r % 2 else ("background", "training thread"):
        hf.hold_written_soon = background if label == "background" else on_thread
        with tempfile.TemporaryDirectory() as work:
            row = hf_trainer.run_arm("adaptive", TASK, 60, 6, Path(work))
        d = [t for t, isd in zip(row["save_seconds"], row["delta"]) if isd]
        res[label].append(d)
        print(f"round {r+1} {label}: deltas mean {statistics.mean(d):.3f} s [{min(d):.3f}, {max(d):.3f}]", flush=True)
for k, v in res.items():
    print(k, "means", [round(statistics.mean(d), 3) for d in v])
