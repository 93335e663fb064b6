import sys, time, tempfile, os, threading
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C, ckptzip.reader as R, ckptzip.writer as W
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
mode = sys.argv[1]
E = {}
def acc(name, f):
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); E[name] = E.get(name, 0) + time.perf_counter() - t; return r
    return g
for cls in (R.FileBase,):
    cls.prefetch = acc("prefetch", cls.prefetch)
C.JointPolicy._values = staticmethod(acc("_values", C.JointPolicy._values))
C.JointPolicy._keep_unchanged = staticmethod(acc("_keep_unchanged", C.JointPolicy._keep_unchanged))
C._all_finite = acc("_all_finite", C._all_finite)
C.JointPolicy.groups = acc("groups", C.JointPolicy.groups)
W._tasks = acc("writer._tasks", W._tasks)
W._encode_task = acc("writer._encode_task", W._encode_task)
W.finish_header = acc("finish_header", W.finish_header)
for threads in (1, 2) * 3:
    E.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    print(f"{mode} t{threads} total {time.perf_counter()-t0:.3f}: " + " ".join(f"{k} {v:.3f}" for k, v in E.items()), flush=True)
