import sys, time, os, collections
sys.path.insert(0, "/work/main/benchmarks")
import ckptzip, torch
from ckptzip import sinks, writer, storage
torch.set_num_threads(1)
d = "/tmp/s28/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
T = collections.defaultdict(list)
def timed(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[label].append(time.perf_counter() - t); return r
    setattr(obj, name, g)
orig_est = writer._header_estimate
def est(*a, **k):
    fn = orig_est(*a, **k)
    def g():
        t = time.perf_counter(); r = fn(); T["estimate"].append(time.perf_counter() - t); return r
    return g
writer._header_estimate = est
timed(sinks.FileSink, "_move_data", "move"); timed(sinks, "store_header", "store_header"); timed(os, "fsync", "fsync")
timed(writer, "finish_header", "finish_header")
for mode in sys.argv[1:]:
    for i in range(4):
        T.clear(); t = time.perf_counter()
        ckptzip.save(second, os.path.join(d, "y.ckz"), mode=mode, base=key, threads=2, resumed=True)
        tot = time.perf_counter() - t
        print(mode, f"{tot:.3f}", {k: [round(x * 1e3, 1) for x in v] for k, v in T.items()}, flush=True)
