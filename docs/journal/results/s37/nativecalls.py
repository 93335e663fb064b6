"""Every _native function wrapped: calls per save, how many under 10 us, median and total time.
usage: nativecalls.py mode (the demo state's delta, one thread)"""
import sys, os, time, tempfile, shutil, collections
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip import _native
mode = sys.argv[1]
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
stats = collections.defaultdict(list)
def wrap(name, f):
    def w(*a, **k):
        s = time.perf_counter_ns()
        try: return f(*a, **k)
        finally: stats[name].append(time.perf_counter_ns() - s)
    return w
for name in dir(_native):
    f = getattr(_native, name)
    if callable(f) and not isinstance(f, type) and not name.startswith("_"):
        setattr(_native, name, wrap(name, f))
ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
stats.clear()
ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
tot = short = 0
for name, v in sorted(stats.items(), key=lambda kv: -len(kv[1])):
    s = sum(1 for x in v if x < 10000)
    tot += len(v); short += s
    print(f"{name:24s} calls {len(v):5d}  <10us {s:5d}  median {sorted(v)[len(v)//2]/1000:.1f} us  total {sum(v)/1e6:.1f} ms")
print("all", tot, "short", short)
shutil.rmtree(d)
