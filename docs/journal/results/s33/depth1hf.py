"""The HF adaptive arm's first delta after its keyframe, held and unheld, profiled (save() only)."""
import sys, tempfile, time, cProfile, pstats, io
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import hf_trainer
import ckptzip.integrations.hf as hf
TASK = hf_trainer.minilm_task()
orig = hf.save
for rnd in range(2):
    for arm in ("adaptive", "adaptive-unheld") if rnd == 0 else ("adaptive-unheld", "adaptive"):
        prof = {}
        def save(state, path, **kw):
            if str(path).endswith("state.ckz") and kw.get("base") is not None:
                pr = cProfile.Profile(); s = time.perf_counter(); pr.enable()
                r = orig(state, path, **kw)
                pr.disable(); prof["t"] = time.perf_counter() - s; prof["pr"] = pr
                return r
            return orig(state, path, **kw)
        hf.save = save
        with tempfile.TemporaryDirectory() as work:
            hf_trainer.run_arm(arm, TASK, 12, 6, Path(work))
        print(f"== round {rnd} {arm}: depth-1 save() {prof['t']:.3f} s")
        out = io.StringIO(); pstats.Stats(prof["pr"], stream=out).sort_stats("cumtime").print_stats(25)
        print("\n".join(out.getvalue().splitlines()[:45]))
