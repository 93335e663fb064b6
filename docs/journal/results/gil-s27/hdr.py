import sys, time, tempfile, os, zlib
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.container as C
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
got = []
orig = C.store_header
def sh(h):
    got.append(h); return orig(h)
import ckptzip.sinks as S
S.store_header = sh
for mode in ("bitsnap", "adaptive", "excp"):
    got.clear()
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=1, resumed=True)
    h = got[-1]
    for lvl in (1, 6, 9):
        t = time.perf_counter(); z = zlib.compress(h, lvl); dt = time.perf_counter() - t
        print(mode, "header", len(h), "level", lvl, len(z), f"{dt*1000:.1f} ms")
