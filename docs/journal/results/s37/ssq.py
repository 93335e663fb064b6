"""Every call of one _native function in a 1-thread save of the demo delta, by its four callers: ms, calls, MB.
usage: ssq.py mode [function, default sum_squares]"""
import sys, os, time, tempfile, shutil, collections, traceback
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip import _native
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
fn_name = sys.argv[2] if len(sys.argv) > 2 else "sum_squares"
f = getattr(_native, fn_name); stats = collections.defaultdict(lambda: [0, 0.0, 0])
def w(*a, **k):
    s = time.perf_counter()
    try: return f(*a, **k)
    finally:
        dt = time.perf_counter() - s
        st = traceback.extract_stack(limit=6)[:-1]
        key = " <- ".join(f"{fr.name}:{fr.lineno}" for fr in reversed(st[-4:]))
        e = stats[key]; e[0] += 1; e[1] += dt; e[2] += len(memoryview(a[0]).cast("B"))
setattr(_native, fn_name, w)
ckptzip.save(second, out, mode=sys.argv[1], base=key, threads=1, resumed=True)
stats.clear()
ckptzip.save(second, out, mode=sys.argv[1], base=key, threads=1, resumed=True)
for k, (n, t, b) in sorted(stats.items(), key=lambda kv: -kv[1][1])[:14]:
    print(f"{t*1000:7.1f} ms {n:5d} calls {b/1e6:8.1f} MB  {k}")
shutil.rmtree(d)
