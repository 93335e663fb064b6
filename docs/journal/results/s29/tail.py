import sys, time, os, threading
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C, ckptzip.sinks as S
import ckptzip.modes.adaptive as A, ckptzip.modes.excp as E, ckptzip.modes.bitsnap as B
torch.set_num_threads(1)
gb = float(sys.argv[1]); mode = sys.argv[2]; threads = int(sys.argv[3])
d = f"/tmp/s29/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb) if gb > 0 else lossy_speed.demo_states(20, 5)
ckptzip.save(first, key, threads=2); del first
pol = [v for m in (A, E, B) for v in vars(m).values() if isinstance(v, type) and issubclass(v, C.JointPolicy) and getattr(v, "mode", None) == mode and "plan_group" in vars(v)][0]
ev = []
def wrap(obj, name, kind):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); ev.append((kind, t, time.perf_counter())); return r
    setattr(obj, name, g)
wrap(pol, "plan_group", "plan"); wrap(C, "precode", "precode"); wrap(S.FileSink, "write", "write"); wrap(S.FileSink, "finish", "finish")
for rep in range(4):
    ev.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "tl.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    t1 = time.perf_counter()
    def span(k):
        es = [e for e in ev if e[0] == k]
        return f"{k} {min(e[1] for e in es)-t0:.2f}-{max(e[2] for e in es)-t0:.2f} (n {len(es)}, busy {sum(e[2]-e[1] for e in es):.2f})" if es else f"{k} -"
    print(f"{mode} t{threads} total {t1-t0:.2f} | " + " | ".join(span(k) for k in ("plan", "precode", "write", "finish")), flush=True)
