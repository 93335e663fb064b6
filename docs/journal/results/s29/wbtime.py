import sys, time, os, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.sinks as S
threads = int(sys.argv[1]); torch.set_num_threads(threads)
d = "/tmp/s29/syn1.0"; key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(1.0)
ckptzip.save(first, key, threads=2); del first
W = []; FS = []; WR = []
wb = S._native.writeback
def timed(*a):
    t = time.perf_counter(); r = wb(*a); W.append(time.perf_counter() - t); return r
S._native.writeback = timed
_fsync = os.fsync
def fsync(fd):
    t = time.perf_counter(); _fsync(fd); FS.append(time.perf_counter() - t)
os.fsync = fsync
write = S.FileSink.write
def w(self, data):
    t = time.perf_counter(); write(self, data); WR.append(time.perf_counter() - t)
S.FileSink.write = w
for mode in sys.argv[2].split(","):
    for i in range(4):
        for on in (0, 1):
            S.FileSink.WRITEBACK_BYTES = (8 << 20) * on
            W.clear(); FS.clear(); WR.clear(); t = time.perf_counter()
            ckptzip.save(second, os.path.join(d, "w.ckz"), mode=mode, base=key, threads=threads, resumed=True)
            print(f"{mode} t{threads} writeback {on}: total {time.perf_counter()-t:.3f} in write() {sum(WR):.3f} (of which writeback {sum(W):.3f}, n {len(W)}) fsync {sum(FS):.3f}", flush=True)
            os.unlink(os.path.join(d, "w.ckz"))
