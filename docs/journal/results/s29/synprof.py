import sys, time, os, cProfile, pstats
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
torch.set_num_threads(1)
gb = float(sys.argv[1]); mode = sys.argv[2]
d = f"/tmp/s29/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb)
ckptzip.save(first, key, threads=2); del first
ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=1, resumed=True)
pr = cProfile.Profile(); t = time.perf_counter(); pr.enable()
ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=1, resumed=True)
pr.disable(); print("wall", time.perf_counter() - t)
st = pstats.Stats(pr); st.sort_stats(sys.argv[3]).print_stats(int(sys.argv[4]))
