"""Where a save's time goes, by thread: each group's plan, look and precode (wall and CPU time),
before and after plan_state. usage: timeline.py mode threads (the demo state's delta, 3 saves, the last shown)"""
import sys, os, time, tempfile, shutil, threading, collections
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.modes import adaptive, common
from ckptzip import writer, planning
mode = sys.argv[1]; threads = int(sys.argv[2])
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
log = []
def wrap(owner, name, tag):
    f = getattr(owner, name)
    def w(*a, **k):
        s = time.perf_counter(); c = time.thread_time()
        try: return f(*a, **k)
        finally: log.append((tag, threading.get_ident(), s, time.perf_counter(), time.thread_time() - c))
    setattr(owner, name, w)
wrap(common.JointPolicy, "plan_state", "plan_state")
from ckptzip.modes import excp as _e, bitsnap as _b
for _c in {adaptive.AdaptivePolicy, _e.ExcpPolicy, _b.BitsnapPolicy}:
    if "plan_group" in vars(_c): wrap(_c, "plan_group", "group")
wrap(common.JointPolicy, "_look", "look")
wrap(common, "precode", "precode")
for i in range(3):
    log.clear()
    s = time.perf_counter(); ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True); e = time.perf_counter()
print("save", e - s)
ps = [x for x in log if x[0] == "plan_state"][0]
print(f"before plan_state {ps[2]-s:.3f}  plan_state {ps[3]-ps[2]:.3f}  after {e-ps[3]:.3f}")
by = collections.defaultdict(float); first_start = {}; last_end = {}
cpu = collections.defaultdict(float)
for tag, tid, a, b, c in log:
    by[(tag, tid)] += b - a; cpu[(tag, tid)] += c
    first_start[tid] = min(first_start.get(tid, 9e9), a); last_end[tid] = max(last_end.get(tid, 0), b)
for k, v in sorted(by.items()): print(k[0], k[1] % 1000, f"wall {v:.3f} cpu {cpu[k]:.3f}")
for t in first_start: print("thread", t % 1000, f"first {first_start[t]-s:.3f} last {last_end[t]-s:.3f}")
ev = sorted(log, key=lambda x: x[2])
for tag, tid, a, b, c in ev:
    if tag != "plan_state": print(f"  {tid % 1000:4d} {tag:8s} {a - s:.3f}-{b - s:.3f} ({(b-a)*1000:.0f} ms, cpu {c*1000:.0f})")
shutil.rmtree(d)
