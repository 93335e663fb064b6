import sys, time, tempfile, os, cProfile, pstats
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.planning import prepare
from ckptzip.reader import open_base
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
mode = sys.argv[1]; threads = int(sys.argv[2])
for i in range(3):
    base = open_base(key)
    p = prepare(second, mode=mode, base=base, resumed=True, threads=threads)
    t = time.perf_counter()
    pr = cProfile.Profile() if i == 2 else None
    if pr: pr.enable()
    ckptzip.save(p, os.path.join(d, "x.ckz"), threads=threads)
    if pr: pr.disable()
    print("write phase", round(time.perf_counter() - t, 3))
pstats.Stats(pr).sort_stats("cumulative").print_stats(25)
