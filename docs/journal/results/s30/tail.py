import sys, time, os, threading
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.writer as W, ckptzip.sinks as S
gb = float(sys.argv[1]); threads = int(sys.argv[2]); n = int(sys.argv[3]); modes = sys.argv[4].split(",")
torch.set_num_threads(threads)
d = f"/tmp/s30/syn{gb}"; os.makedirs(d, exist_ok=True); key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb) if gb > 0 else lossy_speed.demo_states(20, 5)
ckptzip.save(first, key, threads=2); del first
T = {}
prep = W.prepare
def prepare(*a, **k):
    t = time.perf_counter(); r = prep(*a, **k); T["prep"] = time.perf_counter() - t; T["prep_end"] = time.perf_counter(); return r
W.prepare = prepare
wr = S.FileSink.write
def write(self, b):
    t = time.perf_counter(); r = wr(self, b); T["write"] = T.get("write", 0) + time.perf_counter() - t; T["nbytes"] = T.get("nbytes", 0) + len(b); return r
S.FileSink.write = write
fin = S.FileSink.finish
def finish(self, body):
    t = time.perf_counter(); T["fin_start"] = t; r = fin(self, body); T["finish"] = time.perf_counter() - t; return r
S.FileSink.finish = finish
TH = [int(x) for x in os.environ.get("TH", str(threads)).split(",")]
for i in range(n):
    for mode, threads in [(m, t) for m in modes for t in TH]:
        torch.set_num_threads(threads)
        T.clear(); t0 = time.perf_counter()
        ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=threads, resumed=True)
        t1 = time.perf_counter()
        print(f"{mode} t{threads}: total {t1-t0:.3f} prepare {T['prep']:.3f} after-prepare {t1-T['prep_end']:.3f} (writes {T['write']:.3f} for {T['nbytes']/1e6:.0f} MB, data done at {T['fin_start']-T['prep_end']:.3f}, finish {T['finish']:.3f})", flush=True)
        os.unlink(os.path.join(d, "x.ckz"))
