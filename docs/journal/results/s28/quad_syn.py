import sys, time, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C
import ckptzip.modes.excp as E, ckptzip.modes.adaptive as A
torch.set_num_threads(1)
gb = float(sys.argv[1]); threads = int(sys.argv[2]); n = int(sys.argv[3]); mode = sys.argv[4]
pol = E.ExcpPolicy if mode == "excp" else A.AdaptivePolicy
d = f"/tmp/s28/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb)
ckptzip.save(first, key, threads=2); del first
precode = C.precode
def config(fused, pre):
    def setup():
        C.precode = precode if pre else (lambda *a: None)
        if fused:
            if "survey" in vars(pol): del pol.survey
        else:
            pol.survey = lambda self, leaves, groups, base: None
    return setup
cfgs = {"barrier": config(False, False), "barrier+precode": config(False, True), "fused": config(True, False), "fused+precode": config(True, True)}
res = {k: [] for k in cfgs}
for i in range(n):
    order = list(cfgs) if i % 2 == 0 else list(reversed(cfgs))
    for name in order:
        cfgs[name](); t = time.perf_counter()
        ckptzip.save(second, os.path.join(d, "q.ckz"), mode=mode, base=key, threads=threads, resumed=True)
        res[name].append(time.perf_counter() - t)
    print(i, {k: round(v[-1], 3) for k, v in res.items()}, flush=True)
print({k: f"med {statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]" for k, v in res.items()})
