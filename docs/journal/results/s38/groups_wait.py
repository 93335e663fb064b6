"""Wall and CPU time of the small (under 65,536 elements) and the large groups' plans in saves of the demo delta. usage: groups_wait.py mode threads"""
import sys, os, time, tempfile, shutil, threading, collections
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.modes import adaptive, common, excp as _e, bitsnap as _b
mode = sys.argv[1]; threads = int(sys.argv[2])
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
log = []
orig = common.JointPolicy.plan_state
def ps(self, leaves, *a, **k):
    self._leaves_ = leaves
    return orig(self, leaves, *a, **k)
common.JointPolicy.plan_state = ps
for _c in {adaptive.AdaptivePolicy, _e.ExcpPolicy, _b.BitsnapPolicy}:
    if "plan_group" in vars(_c):
        f = vars(_c)["plan_group"]
        def w(self, leaves, values, base, f=f):
            n = max(leaves[i].tensor.numel() for i in values.group.members())
            s = time.perf_counter(); c = time.thread_time()
            try: return f(self, leaves, values, base)
            finally: log.append((n, time.perf_counter() - s, time.thread_time() - c, threading.get_ident()))
        _c.plan_group = w
for i in range(4):
    log.clear()
    s = time.perf_counter(); ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True); e = time.perf_counter() - s
    sm = [x for x in log if x[0] < 65536]; lg = [x for x in log if x[0] >= 65536]
    f = lambda xs: f"n {len(xs)} wall {sum(x[1] for x in xs):.3f} cpu {sum(x[2] for x in xs):.3f}"
    print(f"save {e:.3f} small: {f(sm)}  large: {f(lg)}")
shutil.rmtree(d)
