"""The HF adaptive arm's state.ckz step, held and unheld, timed by its parts."""
import sys, tempfile, time, collections
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import hf_trainer
import ckptzip.integrations.hf as hf
TASK = hf_trainer.minilm_task()
names = ["save", "open_held_base", "flatten", "worth_holding", "hold_written_soon", "settle", "_drop_dependents", "_previous_state"]
origs = {n: getattr(hf, n) for n in names}
orig_state = hf.CkptzipTrainerMixin._ckptzip_save_state
for rnd in range(2):
    for arm in ("adaptive", "adaptive-unheld") if rnd == 0 else ("adaptive-unheld", "adaptive"):
        rows = []
        def wrap(n):
            f = origs[n]
            def g(*a, **k):
                s = time.perf_counter(); r = f(*a, **k)
                if rows and (n != "save" or str(a[1]).endswith("/state.ckz")):
                    rows[-1][n] += time.perf_counter() - s
                return r
            return g
        for n in names: setattr(hf, n, wrap(n))
        def save_state(self, *a, **k):
            rows.append(collections.Counter()); s = time.perf_counter(); r = orig_state(self, *a, **k)
            rows[-1]["STEP"] = time.perf_counter() - s; return r
        hf.CkptzipTrainerMixin._ckptzip_save_state = save_state
        with tempfile.TemporaryDirectory() as work:
            hf_trainer.run_arm(arm, TASK, 18, 6, Path(work))
        print(f"== round {rnd} {arm}")
        for r in rows:
            print("   " + "  ".join(f"{k} {v:.3f}" for k, v in r.items()))
