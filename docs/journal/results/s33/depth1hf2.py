"""The HF adaptive arm's checkpoints, held and unheld: _save_checkpoint against its state.ckz
part (_ckptzip_save_state) and that part's save(), per checkpoint."""
import sys, tempfile, time
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import hf_trainer
import ckptzip.integrations.hf as hf
TASK = hf_trainer.minilm_task()
orig_save, orig_state = hf.save, hf.CkptzipTrainerMixin._ckptzip_save_state
for rnd in range(2):
    for arm in ("adaptive", "adaptive-unheld") if rnd == 0 else ("adaptive-unheld", "adaptive"):
        rows = []
        def save(state, path, **kw):
            s = time.perf_counter(); r = orig_save(state, path, **kw)
            if str(path).endswith("state.ckz"): rows[-1]["save"] = time.perf_counter() - s
            return r
        def save_state(self, *a, **k):
            rows.append({}); s = time.perf_counter(); r = orig_state(self, *a, **k)
            rows[-1]["state_part"] = time.perf_counter() - s; return r
        hf.save = save; hf.CkptzipTrainerMixin._ckptzip_save_state = save_state
        with tempfile.TemporaryDirectory() as work:
            row = hf_trainer.run_arm(arm, TASK, 24, 6, Path(work))
        print(f"== round {rnd} {arm}")
        for r, total in zip(rows, row["save_seconds"]):
            print(f"   _save_checkpoint {total:.3f}  state part {r['state_part']:.3f}  save() {r['save']:.3f}  rest {total - r['state_part']:.3f}")
