import sys, os, time
sys.path.insert(0, "/work/main/benchmarks")
import ckptzip, torch, lossy_speed
import ckptzip.sinks as S
from ckptzip import container
lvl = int(sys.argv[1])
orig_store = container.store_header
import zlib
def store(h):
    d = zlib.compress(h, lvl)
    return (d, container.FLAG_DEFLATE) if len(d) < len(h) else (h, 0)
S.store_header = store
fin = S.FileSink.finish
rows = []
def finish(self, body):
    stored, _ = store(body); rows.append((self.reserved, len(stored))); return fin(self, body)
S.FileSink.finish = finish
states = [("demo", "/tmp/s28/demo")]
for name, d in states:
    key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
    for mode in ("lossless", "excp", "bitsnap", "adaptive"):
        rows.clear(); ckptzip.save(second, os.path.join(d, f"e-{mode}.ckz"), mode=mode, base=key, threads=2, resumed=True)
        r, s = rows[0]; print(f"L{lvl} {name} {mode}: reserved {r} stored {s} margin {(r - s) / s * 100:+.1f}%", flush=True)
first, second, _ = lossy_speed.synthetic_states(0.25)
key = "/tmp/s30/k25.ckz"; ckptzip.save(first, key, threads=2)
for mode in ("lossless", "excp", "bitsnap", "adaptive"):
    rows.clear(); ckptzip.save(second, f"/tmp/s30/e-{mode}.ckz", mode=mode, base=key, threads=2, resumed=True)
    r, s = rows[0]; print(f"L{lvl} syn0.25 {mode}: reserved {r} stored {s} margin {(r - s) / s * 100:+.1f}%", flush=True)
