import sys, time, tempfile, os, shutil
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
mode = sys.argv[1]; n = int(sys.argv[2])
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=1, resumed=True)
open("/tmp/s36/ready", "w").write("1")
t = time.perf_counter()
for _ in range(n):
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=1, resumed=True)
print("per save", (time.perf_counter() - t) / n)
shutil.rmtree(d)
