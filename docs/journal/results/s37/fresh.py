"""table_lookup of 16M codes into fresh memory, malloc's (np.empty) and PageBuffer's in turn, 6 rounds."""
import numpy as np, time, sys
from ckptzip import _native
n = 16 << 20
codes = np.random.randint(0, 15, n).astype(np.uint8)
table = np.linspace(-1, 1, 15)
keep = []
for i in range(6):
    for kind in ("malloc", "pagebuffer"):
        if kind == "malloc":
            fresh = np.empty(n + 1024 * i, np.float32)[:n]; buf = None
        else:
            buf = _native.PageBuffer(n * 4 + 4096 * (i + 1)); fresh = np.frombuffer(buf, np.float32)[:n]
        s = time.perf_counter(); _native.table_lookup(codes, table, fresh, 4); t = time.perf_counter() - s
        print(f"{kind:10s} {t/n*1e9:6.2f} ns/elem", flush=True)
        if len(sys.argv) > 1: keep.append((fresh, buf))
        del fresh, buf
