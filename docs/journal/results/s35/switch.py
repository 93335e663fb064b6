import sys, time, tempfile, os, statistics
sys.path.insert(0, "benchmarks")
import lossy_speed, ckptzip, torch
mode = sys.argv[1]; values = [float(x) for x in sys.argv[2].split(",")]; pairs = int(sys.argv[3])
torch.set_num_threads(2)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "d.ckz")
ckptzip.save(second, out, mode=mode, base=key, threads=2, resumed=True)
T = {v: [] for v in values}
for p in range(pairs):
    order = values if p % 2 == 0 else values[::-1]
    for v in order:
        sys.setswitchinterval(v)
        t = time.perf_counter()
        ckptzip.save(second, out, mode=mode, base=key, threads=2, resumed=True)
        T[v].append(time.perf_counter() - t)
sys.setswitchinterval(0.005)
for v in values: print(mode, f"switchinterval {v*1e3:.2f} ms: median {statistics.median(T[v]):.3f} [{min(T[v]):.3f}-{max(T[v]):.3f}]")
