import sys, time, os, statistics
import ckptzip, torch
torch.set_num_threads(1)
mode, build = sys.argv[1], sys.argv[2]
d = "/tmp/s28/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
out = {}
for threads in (2, 1):
    ts = []
    for i in range(4):
        t = time.perf_counter(); ckptzip.save(second, os.path.join(d, f"ab-{build}.ckz"), mode=mode, base=key, threads=threads, resumed=True); ts.append(time.perf_counter() - t)
    out[threads] = ts
print(f"{build} {mode} t2 {statistics.median(out[2]):.3f} [{min(out[2]):.3f}-{max(out[2]):.3f}] t1 {statistics.median(out[1]):.3f} [{min(out[1]):.3f}-{max(out[1]):.3f}] ratio {statistics.median(out[1])/statistics.median(out[2]):.2f}", flush=True)
