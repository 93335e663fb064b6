import sys, tempfile, os, json, zlib, collections, time
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip import container
first, second, _ = lossy_speed.demo_states(20, 5)
d = "/tmp/s28/demo"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
torch.save(second, os.path.join(d, "second.pt"))
for mode in ("bitsnap", "excp", "adaptive"):
    p = os.path.join(d, f"{mode}.ckz"); ckptzip.save(second, p, mode=mode, base=key, threads=2, resumed=True)
    f = ckptzip.open(p)
    print(mode, os.path.getsize(p))
