import sys, os, zlib, time, json, statistics
import ckptzip, torch
from ckptzip import container, writer
torch.set_num_threads(1)
d = "/tmp/s28/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
cap = {}
orig = container.store_header
def grab(h):
    cap["h"] = h; return orig(h)
writer.finish_header.__globals__  # noqa
import ckptzip.sinks as S
S.store_header = grab
for mode in ("lossless", "excp", "bitsnap", "adaptive"):
    p = os.path.join(d, f"h-{mode}.ckz")
    ckptzip.save(second, p, mode=mode, base=key, threads=2, resumed=True)
    h = cap["h"]; size = os.path.getsize(p)
    row = [f"{mode}: file {size/1e6:.2f} MB, header JSON {len(h)/1e3:.0f} kB"]
    for lvl in (9, 6, 4, 1):
        ts = []
        for _ in range(7):
            t = time.perf_counter(); c = zlib.compress(h, lvl); ts.append(time.perf_counter() - t)
        row.append(f"L{lvl} {len(c)/1e3:.1f} kB {statistics.median(ts)*1e3:.1f} ms")
    print(" | ".join(row), flush=True)
