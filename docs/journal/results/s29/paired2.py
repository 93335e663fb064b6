import sys, time, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip import hostpath as H
gb = float(sys.argv[1]); threads = int(sys.argv[2]); n = int(sys.argv[3]); modes = sys.argv[4].split(",")
torch.set_num_threads(threads)
d = f"/tmp/s29/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb) if gb > 0 else lossy_speed.demo_states(20, 5)
ckptzip.save(first, key, threads=2); del first
NEW = (H.count_nonzero, H.kth_magnitude, H.median_magnitude)
OLD = (lambda t: int(torch.count_nonzero(t)), lambda t, k: t.detach().reshape(-1).abs().kthvalue(k + 1).values, lambda t: t.abs().median())
def use(fns):
    H.count_nonzero, H.kth_magnitude, H.median_magnitude = fns
for mode in modes:
    res = {"old": [], "new": []}
    for i in range(n):
        for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
            use(OLD if name == "old" else NEW); t = time.perf_counter()
            ckptzip.save(second, os.path.join(d, f"p-{name}.ckz"), mode=mode, base=key, threads=threads, resumed=True)
            res[name].append(time.perf_counter() - t)
            os.unlink(os.path.join(d, f"p-{name}.ckz"))
    diff = [a - b for a, b in zip(res["new"], res["old"])]
    q = lambda v: f"med {statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
    print(f"{mode} t{threads} {gb} GB: old {q(res['old'])} new {q(res['new'])} paired new-old {q(diff)}; new faster in {sum(x < 0 for x in diff)}/{n}", flush=True)
