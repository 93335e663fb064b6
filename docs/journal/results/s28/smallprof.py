import sys, time, tempfile, os, cProfile, pstats
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C
from ckptzip import modes
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
mode = sys.argv[1]
pr = cProfile.Profile()
T = {"small": 0.0, "n": 0}
orig = C.JointPolicy.plan_group
import ckptzip.modes.adaptive, ckptzip.modes.excp, ckptzip.modes.bitsnap
def find_cls():
    for m in (ckptzip.modes.adaptive, ckptzip.modes.excp, ckptzip.modes.bitsnap):
        for v in vars(m).values():
            if isinstance(v, type) and issubclass(v, C.JointPolicy) and v.mode == mode and "plan_group" in vars(v):
                return v
cls = find_cls(); orig = cls.plan_group
def pg(self, leaves, values, base):
    n = sum(leaves[i].tensor.numel() for i in values.group.members())
    if n * 4 < 512 * 1024:
        t = time.perf_counter(); pr.enable(); r = orig(self, leaves, values, base); pr.disable(); T["small"] += time.perf_counter() - t; T["n"] += 1
        return r
    return orig(self, leaves, values, base)
cls.plan_group = pg
for i in range(3):
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=1, resumed=True)
print(cls, T)
st = pstats.Stats(pr); st.sort_stats(sys.argv[2] if len(sys.argv) > 2 else "tottime").print_stats(45)
