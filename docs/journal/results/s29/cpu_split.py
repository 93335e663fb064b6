import sys, time, os, resource
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
torch.set_num_threads(1)
gb = float(sys.argv[1]); n = int(sys.argv[2]); modes = sys.argv[3].split(",")
d = f"/tmp/s29/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb) if gb > 0 else lossy_speed.demo_states(20, 5)
ckptzip.save(first, key, threads=2); del first
for i in range(n):
    for mode in modes:
        for threads in [int(x) for x in os.environ.get("TH", "1,2").split(",")]:
            torch.set_num_threads(threads)
            r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
            ckptzip.save(second, os.path.join(d, f"x.ckz"), mode=mode, base=key, threads=threads, resumed=True)
            w = time.perf_counter() - t; r1 = resource.getrusage(resource.RUSAGE_SELF)
            u = r1.ru_utime - r0.ru_utime; s = r1.ru_stime - r0.ru_stime
            print(f"{mode:8s} t{threads} wall {w:.2f} user {u:.2f} sys {s:.2f} minflt {r1.ru_minflt - r0.ru_minflt} util {(u+s)/w:.2f}", flush=True)
