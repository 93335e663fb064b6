"""One process's 1-thread saves, timed; waits for a start file so two can start together.
usage: proc.py mode n tag"""
import sys, os, time, tempfile, shutil
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
mode, n, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=1)
out = os.path.join(d, "x.ckz")
ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
open(f"/tmp/s37/ready-{tag}", "w").close()
while not os.path.exists("/tmp/s37/go"): time.sleep(0.01)
ts = []
for _ in range(n):
    s = time.perf_counter(); ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True); ts.append(time.perf_counter() - s)
print(tag, " ".join(f"{t:.3f}" for t in ts), flush=True)
shutil.rmtree(d)
