import sys, time, tempfile, os
sys.path.insert(0, "benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C, ckptzip.planning as P, ckptzip.writer as W
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
T = {}
def timed(mod, name):
    f = getattr(mod, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[name] = T.get(name, 0) + time.perf_counter() - t; return r
    setattr(mod, name, g)
orig_plan_state = C.JointPolicy.plan_state
def ps(self, *a, **k):
    t = time.perf_counter(); r = orig_plan_state(self, *a, **k); T["plan_state"] = T.get("plan_state", 0) + time.perf_counter() - t; return r
C.JointPolicy.plan_state = ps
group_times = []
from ckptzip.modes.adaptive import AdaptivePolicy
opg = AdaptivePolicy.plan_group
def pg(self, leaves, values, base):
    t = time.perf_counter(); r = opg(self, leaves, values, base); group_times.append(time.perf_counter() - t); return r
AdaptivePolicy.plan_group = pg
for threads in (1, 2, 1, 2, 1, 2):
    T.clear(); group_times.clear()
    t = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode="adaptive", base=key, threads=threads, resumed=True)
    total = time.perf_counter() - t
    gt = sorted(group_times, reverse=True)
    print(f"threads {threads}: total {total:.2f}s plan_state {T['plan_state']:.2f}s rest {total-T['plan_state']:.2f}s; groups {len(gt)} sum {sum(gt):.2f}s top5 {[round(x,3) for x in gt[:5]]}", flush=True)
