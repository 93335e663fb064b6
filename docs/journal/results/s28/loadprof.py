import sys, time, os, tempfile, cProfile, pstats
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
torch.set_num_threads(1)
gb = float(sys.argv[1]); mode = sys.argv[2]
first, second, params = lossy_speed.synthetic_states(gb)
d = tempfile.mkdtemp(dir="/tmp/s28"); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
t = time.perf_counter(); ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True); ts = time.perf_counter() - t
raw = params * 12
print(f"save {ts:.2f}s {raw/ts/1e6:.0f} MB/s", flush=True)
for i in range(3):
    t = time.perf_counter(); s = ckptzip.load(out, threads=1); tl = time.perf_counter() - t
    print(f"load {tl:.2f}s {raw/tl/1e6:.0f} MB/s", flush=True); del s
if len(sys.argv) > 3:
    pr = cProfile.Profile(); pr.enable(); s = ckptzip.load(out, threads=1); pr.disable(); del s
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
