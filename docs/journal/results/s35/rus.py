import sys, time, tempfile, os, threading, resource
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.modes import adaptive
mode = sys.argv[1]
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
acc = {}; lock = threading.Lock()
orig = adaptive.AdaptivePolicy.plan_group
F = ("ru_utime", "ru_stime", "ru_minflt", "ru_nvcsw", "ru_nivcsw")
def pg(self, *a):
    r0 = resource.getrusage(resource.RUSAGE_THREAD); t = time.perf_counter()
    r = orig(self, *a)
    r1 = resource.getrusage(resource.RUSAGE_THREAD); w = time.perf_counter() - t
    with lock:
        acc["wall"] = acc.get("wall", 0) + w
        for f in F: acc[f] = acc.get(f, 0) + getattr(r1, f) - getattr(r0, f)
    return r
adaptive.AdaptivePolicy.plan_group = pg
for rnd in range(3):
    for threads in (1, 2):
        torch.set_num_threads(threads); acc.clear()
        t = time.perf_counter()
        ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=threads, resumed=True)
        print(f"t{threads} {time.perf_counter()-t:.3f} groups: " + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in acc.items()), flush=True)
