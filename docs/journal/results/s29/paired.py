import sys, time, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.sinks as S, ckptzip.modes.bitsnap as B
gb = float(sys.argv[1]); threads = int(sys.argv[2]); n = int(sys.argv[3]); modes = sys.argv[4].split(",")
torch.set_num_threads(threads)
d = f"/tmp/s29/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb) if gb > 0 else lossy_speed.demo_states(20, 5)
ckptzip.save(first, key, threads=2); del first
survey = B.BitsnapPolicy.survey
FS = []
_fsync = os.fsync
def fsync(fd):
    t = time.perf_counter(); _fsync(fd); FS.append(time.perf_counter() - t)
os.fsync = fsync
def old():
    S.FileSink.WRITEBACK_BYTES = 0
    B.BitsnapPolicy.survey = lambda self, leaves, groups, base, threads=1: survey(self, leaves, groups, base, 1)
def new():
    S.FileSink.WRITEBACK_BYTES = 8 << 20; B.BitsnapPolicy.survey = survey
for mode in modes:
    res = {"old": [], "new": []}; fs = {"old": [], "new": []}
    for i in range(n):
        for name, setup in (("old", old), ("new", new)) if i % 2 == 0 else (("new", new), ("old", old)):
            setup(); FS.clear(); t = time.perf_counter()
            ckptzip.save(second, os.path.join(d, f"p-{name}.ckz"), mode=mode, base=key, threads=threads, resumed=True)
            res[name].append(time.perf_counter() - t); fs[name].append(sum(FS))
            os.unlink(os.path.join(d, f"p-{name}.ckz"))
    diff = [a - b for a, b in zip(res["new"], res["old"])]
    q = lambda v: f"med {statistics.median(v):.3f} [{min(v):.3f}-{max(v):.3f}]"
    print(f"{mode} t{threads} {gb} GB: old {q(res['old'])} new {q(res['new'])} paired new-old {q(diff)}; new faster in {sum(x < 0 for x in diff)}/{n}; fsync old {q(fs['old'])} new {q(fs['new'])}", flush=True)
