import sys, tempfile, os, cProfile, pstats, time
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.modes import adaptive, common
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz")
ckptzip.save(first, key, threads=2)
pr = cProfile.Profile(); small_t = [0.0, 0]; large_t = [0.0, 0]
orig = adaptive.AdaptivePolicy.plan_group
def wrapped(self, leaves, values, base):
    size = sum(leaves[i].nbytes for i in values.group.members())
    small = size < common.GROUP_FIXED_BYTES
    t = time.perf_counter()
    if small and PROF: pr.enable()
    try: return orig(self, leaves, values, base)
    finally:
        if small and PROF: pr.disable()
        acc = small_t if small else large_t; acc[0] += time.perf_counter() - t; acc[1] += 1
adaptive.AdaptivePolicy.plan_group = wrapped
PROF = False
ckptzip.save(second, os.path.join(d, "d.ckz"), mode="adaptive", base=key, threads=1, resumed=True)
print(f"no profiler: small groups {small_t[1]} {small_t[0]:.3f} s; large {large_t[1]} {large_t[0]:.3f} s")
small_t[:] = [0.0, 0]; large_t[:] = [0.0, 0]; PROF = True
ckptzip.save(second, os.path.join(d, "d.ckz"), mode="adaptive", base=key, threads=1, resumed=True)
print(f"profiled: small groups {small_t[1]} {small_t[0]:.3f} s")
st = pstats.Stats(pr); st.sort_stats("cumulative").print_stats(45)
