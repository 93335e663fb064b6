"""Elements and seconds of table_lookup in adaptive loads of the 1 GB synthetic state's delta, 3 loads in one process."""
import sys, os, time, tempfile, shutil
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip import _native
torch.set_num_threads(1)
first, second, _ = lossy_speed.synthetic_states(1.0)
tmp = tempfile.mkdtemp()
key = os.path.join(tmp, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(tmp, "d.ckz"); ckptzip.save(second, out, mode="adaptive", base=key, threads=2, resumed=True)
f = _native.table_lookup; acc = [0, 0.0]
def w(codes, table, dst, elem_size):
    s = time.perf_counter()
    try: return f(codes, table, dst, elem_size)
    finally: acc[0] += len(memoryview(codes).cast("B")); acc[1] += time.perf_counter() - s
_native.table_lookup = w
for i in range(3):
    acc[:] = [0, 0.0]
    s = time.perf_counter(); st = ckptzip.load(out, threads=1); t = time.perf_counter() - s; del st
    print(f"load {i}: {t:.2f} s; table_lookup {acc[0]/1e6:.0f}M elements in {acc[1]:.2f} s, {acc[1]/acc[0]*1e9:.1f} ns each", flush=True)
shutil.rmtree(tmp)
