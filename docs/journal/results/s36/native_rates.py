"""ns per element of each native call in one-thread saves and loads of the synthetic state's
adaptive delta (every _native function wrapped: calls, seconds, elements of its largest buffer
argument).  usage: GB=1 native_rates.py [mode]"""
import sys, os, time, tempfile, shutil, collections
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip import _native
torch.set_num_threads(1)
mode = sys.argv[1] if len(sys.argv) > 1 else "adaptive"
stats = collections.defaultdict(lambda: [0, 0.0, 0])
def wrap(name, fn):
    def inner(*a, **k):
        size = 0
        for x in a:
            try:
                m = memoryview(x); size = max(size, m.nbytes // max(m.itemsize, 1))
            except TypeError:
                pass
        t = time.perf_counter(); r = fn(*a, **k); s = stats[name]; s[0] += 1; s[1] += time.perf_counter() - t; s[2] += size
        return r
    return inner
for name in dir(_native):
    f = getattr(_native, name)
    if callable(f) and not name.startswith("_") and type(f).__name__ == "builtin_function_or_method":
        setattr(_native, name, wrap(name, f))
tmp = tempfile.mkdtemp()
try:
    first, second, _ = lossy_speed.synthetic_states(float(os.environ.get("GB", "1")))
    key = os.path.join(tmp, "k.ckz"); ckptzip.save(first, key, threads=2)
    out = os.path.join(tmp, "d.ckz")
    for what in os.environ.get("WHAT", "save,save,load,load").split(","):
        stats.clear()
        t = time.perf_counter()
        if what == "save":
            ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
        else:
            s = ckptzip.load(out, threads=1); del s
        total = time.perf_counter() - t
        print(f"== {what} {total:.2f} s, native {sum(v[1] for v in stats.values()):.2f} s")
        for name, (calls, sec, el) in sorted(stats.items(), key=lambda kv: -kv[1][1])[:16]:
            print(f"  {name:24s} {calls:5d} calls {sec:6.3f} s {el/1e6:8.1f} M el {sec*1e9/max(el,1):6.2f} ns/el")
finally:
    shutil.rmtree(tmp)
