import sys, time, tempfile, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(dir="/tmp/s28"); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
mode = sys.argv[1]
orig = C.plan_tasks
def variant(frac):
    def plan_tasks(sizes, threads):
        tasks = orig(sizes, threads)
        if threads <= 1 or frac is None or len(tasks[-1]) <= 1: return tasks
        large, small = tasks[:-1], tasks[-1]
        total = sum(sizes[t[0]] for t in large); acc = 0
        for i, t in enumerate(large):
            if acc >= frac * total: break
            acc += sizes[t[0]]
        else:
            i = len(large)
        return [*large[:i], small, *large[i:]]
    return plan_tasks
V = {"last": None, "f0.5": 0.5, "f0.7": 0.7, "f0.85": 0.85}
res = {k: [] for k in V}
for r in range(5):
    for name, f in V.items():
        C.plan_tasks = variant(f)
        for _ in range(3):
            t = time.perf_counter(); ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=2, resumed=True)
            res[name].append(time.perf_counter() - t)
    print(r, {k: f"{statistics.median(v[-3:]):.3f}" for k, v in res.items()}, flush=True)
print({k: f"{min(v):.3f}-{max(v):.3f} med {statistics.median(v):.3f}" for k, v in res.items()})
