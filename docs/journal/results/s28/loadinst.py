import sys, time, os, glob, collections
import ckptzip, torch
from ckptzip import _native
torch.set_num_threads(1)
out = sys.argv[1]
T = collections.defaultdict(float); N = collections.Counter(); B = collections.Counter()
def wrap(name):
    f = getattr(_native, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[name] += time.perf_counter() - t; N[name] += 1
        if name == "step_restore": B[(a[1], a[0].dtype.str)] += a[0].size
        return r
    setattr(_native, name, g)
for n in ("step_restore", "dither_shift", "table_lookup", "decode_chunks", "ratio_restore", "residual_add", "keep_changed"):
    wrap(n)
for i in range(3):
    T.clear(); t = time.perf_counter(); s = ckptzip.load(out, threads=1); tl = time.perf_counter() - t
    print(f"load {tl:.2f}s", {k: round(v, 3) for k, v in T.items()}, dict(B)); del s
