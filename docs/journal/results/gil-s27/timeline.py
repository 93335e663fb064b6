import sys, time, tempfile, os, threading
sys.path.insert(0, "benchmarks")
import lossy_speed, ckptzip, torch
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
mode = sys.argv[1]
from ckptzip.modes import policy_for
pol = type(policy_for(mode)); opg = pol.plan_group
R = []
def pg(self, leaves, values, base):
    n = max(int(t.numel()) for t in (values.w, values.m, values.v) if t is not None)
    s = time.perf_counter(); c = time.thread_time(); r = opg(self, leaves, values, base)
    R.append((threading.get_ident(), n, s, time.perf_counter(), time.thread_time() - c)); return r
pol.plan_group = pg
for threads in (1, 2) * 3:
    R.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    total = time.perf_counter() - t0
    big = [r for r in R if r[1] >= 10000]; small = [r for r in R if r[1] < 10000]
    span = lambda rs: (max(r[3] for r in rs) - min(r[2] for r in rs))
    print(f"{mode} t{threads} total {total:.2f} plan span {span(R):.2f}; big span {span(big):.2f} sum {sum(r[3]-r[2] for r in big):.2f} cpu {sum(r[4] for r in big):.2f}; small span {span(small):.2f} sum {sum(r[3]-r[2] for r in small):.3f} cpu {sum(r[4] for r in small):.3f}", flush=True)
