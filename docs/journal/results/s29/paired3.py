import sys, time, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.excp as E
gb = float(sys.argv[1]); threads = int(sys.argv[2]); n = int(sys.argv[3])
torch.set_num_threads(threads)
d = f"/tmp/s29/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb) if gb > 0 else lossy_speed.demo_states(20, 5)
ckptzip.save(first, key, threads=2); del first
NEW = (E._magnitude, E._product); OLD = (lambda v: v.abs(), lambda v, m: v * m)
res = {"old": [], "new": []}
for i in range(n):
    for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
        E._magnitude, E._product = OLD if name == "old" else NEW; t = time.perf_counter()
        ckptzip.save(second, os.path.join(d, f"p-{name}.ckz"), mode="excp", base=key, threads=threads, resumed=True)
        res[name].append(time.perf_counter() - t)
        os.unlink(os.path.join(d, f"p-{name}.ckz"))
diff = [a - b for a, b in zip(res["new"], res["old"])]
q = lambda v: f"med {statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
print(f"excp t{threads} {gb} GB: old {q(res['old'])} new {q(res['new'])} paired new-old {q(diff)}; new faster in {sum(x < 0 for x in diff)}/{n}", flush=True)
