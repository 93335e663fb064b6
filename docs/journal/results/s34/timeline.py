import sys, time, tempfile, os, threading
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C, ckptzip.planning as P, ckptzip.writer as W
from ckptzip.modes import adaptive
threads = int(sys.argv[2]); torch.set_num_threads(threads)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
mode = sys.argv[1]
E = []; lock = threading.Lock()
def mark(name, f):
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k)
        with lock: E.append((t, time.perf_counter(), threading.current_thread().name[-8:], name))
        return r
    return g
orig = adaptive.AdaptivePolicy.plan_group
def pg(self, leaves, values, base):
    size = sum(leaves[i].nbytes for i in values.group.members())
    return mark(f"group{size//1000}k", orig)(self, leaves, values, base)
adaptive.AdaptivePolicy.plan_group = pg
C.JointPolicy._look = mark("look", C.JointPolicy._look)
W.finish_header = mark("finish_header", W.finish_header)
for name in ("precode",):
    if hasattr(C, name): setattr(C, name, mark(name, getattr(C, name)))
for r in range(3):
    E.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    t1 = time.perf_counter()
    print(f"== {mode} t{threads} total {t1-t0:.3f}")
    if r == 2:
        for a, b, th, n in sorted(E):
            if True: print(f"  {a-t0:.3f}-{b-t0:.3f} {th:>8} {n}")
        groups = [e for e in E if e[3].startswith("group")]
        print("last group end", max(b for a, b, th, n in groups) - t0)
