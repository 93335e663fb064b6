import sys, time, tempfile, os
sys.path.insert(0, "benchmarks")
import lossy_speed, ckptzip, torch
torch.set_num_threads(int(sys.argv[1]))
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz")
ckptzip.save(first, key, threads=2)
threads = int(sys.argv[1]); mode = sys.argv[2]
for r in range(int(sys.argv[3])):
    t = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "d.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    print(mode, threads, f"{time.perf_counter()-t:.2f}s", flush=True)
