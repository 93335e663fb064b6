import sys, time, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import torch, ckptzip, lossy_speed
from ckptzip.held import hold_written, hold_written_soon, settle, open_held_base
from ckptzip.tree import flatten
first, second, params = lossy_speed.demo_states(20, 5)
work = Path(tempfile.mkdtemp()); key = work / "k.ckz"; ckptzip.save(first, key)
leaves = {l.name: l for l in flatten(first)[1]}
for mode in ("adaptive", "excp"):
    for _ in range(3):
        held = hold_written(str(key), leaves, None, copy=True)
        p = work / "d.ckz"
        ckptzip.save(second, p, mode=mode, base=open_held_base(key, held), resumed=True)
        held = hold_written(str(key), leaves, None, copy=True)
        l2 = {l.name: l for l in flatten(second)[1]}
        s = time.perf_counter(); h = hold_written(str(p), l2, held, copy=True); t1 = time.perf_counter() - s
        held = hold_written(str(key), leaves, None, copy=True)
        s = time.perf_counter(); pend = hold_written_soon(str(p), l2, held); t2 = time.perf_counter() - s
        h2 = settle(pend); t3 = time.perf_counter() - s
        print(f"{mode}: hold_written {t1:.3f} s; soon returns in {t2:.3f} s, settled at {t3:.3f} s; {len(h.tensors)} tensors")
