import sys, time, tempfile, os
import ckptzip, torch
import ckptzip.writer as W, ckptzip.modes.common as C
torch.set_num_threads(1)
d = "/tmp/s28/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
mode = sys.argv[1]; E = {}
def mark(name, f):
    def g(*a, **k):
        E[name + "+"] = time.perf_counter(); r = f(*a, **k); E[name + "-"] = time.perf_counter(); return r
    return g
C.JointPolicy.plan_state = mark("plan", C.JointPolicy.plan_state)
W.finish_header = mark("fh", W.finish_header)
for threads in (1, 2) * 3:
    E.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "tl2.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    t1 = time.perf_counter()
    print(f"{mode} t{threads} total {t1-t0:.3f}: " + " ".join(f"{k}@{v-t0:.3f}" for k, v in sorted(E.items(), key=lambda x: x[1])), flush=True)
