"""The 2-thread over 1-thread speed of the demo delta's adaptive save with the rank search (factor_update) as it is, or skipped (no low-rank factors: other files, a third less work). usage: nofactor.py normal|nofactor rounds"""
import sys, os, time, tempfile, shutil, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.modes import factoring, adaptive
variant = sys.argv[1]; rounds = int(sys.argv[2])
if variant == "nofactor":
    factoring.factor_update = lambda *a, **k: None
    adaptive.factor_update = lambda *a, **k: None
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
for t in (1, 2): r = ckptzip.save(second, out, mode="adaptive", base=key, threads=t, resumed=True)
ratios = []; t1s = []; t2s = []
for i in range(rounds):
    times = {}
    for t in ((1, 2) if i % 2 == 0 else (2, 1)):
        s = time.perf_counter(); ckptzip.save(second, out, mode="adaptive", base=key, threads=t, resumed=True); times[t] = time.perf_counter() - s
    ratios.append(times[1] / times[2]); t1s.append(times[1]); t2s.append(times[2])
print(f"{variant}: stored {os.path.getsize(out)} B, 1t median {statistics.median(t1s):.3f}, 2t {statistics.median(t2s):.3f}, 2t/1t median x{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
shutil.rmtree(d)
