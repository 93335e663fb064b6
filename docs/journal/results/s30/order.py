import sys, time, os, statistics
import ckptzip, torch
import ckptzip.modes.common as C
torch.set_num_threads(1)
d = "/tmp/s28/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
modes = sys.argv[1].split(","); n = int(sys.argv[2]); variants = sys.argv[3].split(",")
orig = C.plan_tasks
def make(variant):
    # "last": today's; "kN": the small task before the last N large ones; optional "@si" switch interval
    name, _, si = variant.partition("@")
    def plan_tasks(sizes, threads):
        tasks = orig(sizes, threads)
        if name == "last" or threads <= 1 or not tasks or len(tasks[-1]) < 2:
            return tasks
        k = int(name[1:]); small = tasks[-1]; large = tasks[:-1]
        k = min(k, len(large))
        return large[:len(large) - k] + [small] + large[len(large) - k:]
    return plan_tasks, float(si) / 1000 if si else 0.005
for mode in modes:
    res = {v: [] for v in variants}
    for i in range(n):
        for v in (variants if i % 2 == 0 else variants[::-1]):
            fn, si = make(v); C.plan_tasks = fn; sys.setswitchinterval(si)
            t = time.perf_counter()
            ckptzip.save(second, os.path.join(d, "o.ckz"), mode=mode, base=key, threads=2, resumed=True)
            res[v].append(time.perf_counter() - t)
    base = res[variants[0]]
    print(mode, " | ".join(f"{v}: med {statistics.median(r):.3f} [{min(r):.3f}-{max(r):.3f}] paired-diff {statistics.median([a-b for a,b in zip(r, base)]):+.3f}" for v, r in res.items()), flush=True)
C.plan_tasks = orig
