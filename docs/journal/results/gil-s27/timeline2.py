import sys, time, tempfile, os, threading
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C, ckptzip.planning as P, ckptzip.writer as W
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
mode = sys.argv[1]
E = {}
def mark(name, f):
    def g(*a, **k):
        E[name + "+"] = time.perf_counter(); r = f(*a, **k); E[name + "-"] = time.perf_counter(); return r
    return g
C.JointPolicy.groups = mark("groups", C.JointPolicy.groups)
C.JointPolicy.plan_state = mark("plan_state", C.JointPolicy.plan_state)
W.prepare = mark("prepare", W.prepare)
import ckptzip.tree as T
P.flatten = mark("flatten", P.flatten) if hasattr(P, "flatten") else None
W.finish_header = mark("finish_header", W.finish_header)
for threads in (1, 2) * 3:
    E.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    t1 = time.perf_counter()
    ev = sorted((v - t0, k) for k, v in E.items())
    print(f"{mode} t{threads} total {t1-t0:.3f}: " + " ".join(f"{k}@{v:.3f}" for v, k in ev), flush=True)
