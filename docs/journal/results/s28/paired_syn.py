import sys, time, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C
import ckptzip.modes.adaptive as A, ckptzip.modes.excp as E, ckptzip.modes.bitsnap as B
torch.set_num_threads(1)
gb = float(sys.argv[1]); threads = int(sys.argv[2]); n = int(sys.argv[3]); modes = sys.argv[4].split(",")
d = f"/tmp/s28/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb)
ckptzip.save(first, key, threads=2); del first
precode = C.precode
for mode in modes:
    pol = [v for m in (A, E, B) for v in vars(m).values() if isinstance(v, type) and issubclass(v, C.JointPolicy) and getattr(v, "mode", None) == mode and "plan_group" in vars(v)][0]
    def old():
        C.precode = lambda *a: None
        if mode != "bitsnap": pol.survey = lambda self, leaves, groups, base: None
    def new():
        C.precode = precode
        if mode != "bitsnap" and "survey" in vars(pol): del pol.survey
    res = {"old": [], "new": []}
    for i in range(n):
        for name, setup in (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old)):
            setup(); t = time.perf_counter()
            ckptzip.save(second, os.path.join(d, f"p-{name}.ckz"), mode=mode, base=key, threads=threads, resumed=True)
            res[name].append(time.perf_counter() - t)
    new()
    diff = [a - b for a, b in zip(res["new"], res["old"])]
    q = lambda v: f"med {statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
    print(f"{mode} t{threads} {gb} GB: old {q(res['old'])} new {q(res['new'])} paired new-old {q(diff)}; new faster in {sum(x < 0 for x in diff)}/{n}", flush=True)
