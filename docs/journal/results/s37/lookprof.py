"""cProfile of one policy method over a 1-thread save of the demo delta.
usage: lookprof.py mode Class.method [sort] (Class: a name in modes.common, or adaptive.plan_group)"""
import sys, os, time, tempfile, shutil, cProfile, pstats
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.modes import common
mode = sys.argv[1]; target = sys.argv[2]
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
prof = cProfile.Profile(); on = [False]; tt = [0.0]
owner, name = target.split(".")
cls = getattr(common, owner) if owner != "adaptive" else __import__("ckptzip.modes.adaptive", fromlist=["x"]).AdaptivePolicy
orig = getattr(cls, name)
def wrapped(*a, **k):
    if not on[0]: return orig(*a, **k)
    s = time.perf_counter(); prof.enable()
    try: return orig(*a, **k)
    finally: prof.disable(); tt[0] += time.perf_counter() - s
setattr(cls, name, wrapped)
ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
on[0] = True
ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
print(target, "total", round(tt[0], 3))
pstats.Stats(prof).sort_stats(sys.argv[3] if len(sys.argv) > 3 else "cumtime").print_stats(30)
shutil.rmtree(d)
