import sys, time, os, cProfile, pstats
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
torch.set_num_threads(1)
mode = sys.argv[1]
d = "/tmp/s29/syn1.0"; key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(1.0)
ckptzip.save(first, key, threads=2); del first
p = os.path.join(d, f"l-{mode}.ckz")
ckptzip.save(second, p, mode=mode, base=key, threads=2, resumed=True); del second
for i in range(2):
    t = time.perf_counter(); out = ckptzip.load(p, threads=1); print("load", time.perf_counter() - t); del out
pr = cProfile.Profile(); t = time.perf_counter(); pr.enable()
out = ckptzip.load(p, threads=1)
pr.disable(); print("profiled load", time.perf_counter() - t)
pstats.Stats(pr).sort_stats("tottime").print_stats(18)
