import sys, time, tempfile, copy
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks")
import torch, ckptzip, lossy_speed
from ckptzip.held import hold_written, open_held_base
from ckptzip.tree import flatten
first, second, params = lossy_speed.demo_states(20, 5)
for st in (first, second):
    for g in st["optimizer"]["param_groups"]:
        g["betas"] = (g["betas"][0], 0.999)
work = Path(tempfile.mkdtemp()); key = work / "k.ckz"; ckptzip.save(first, key)
leaves = {l.name: l for l in flatten(first)[1]}
for r in range(4):
    held = hold_written(str(key), leaves, None, copy=True)
    for label in (("held", "file") if r % 2 else ("file", "held")):
        base = open_held_base(key, held) if label == "held" else key
        s = time.perf_counter(); ckptzip.save(second, work / f"{label}.ckz", mode="adaptive", base=base, resumed=True); t = time.perf_counter() - s
        print(f"round {r}: {label} {t:.3f} s")
print((work / "held.ckz").read_bytes() == (work / "file.ckz").read_bytes())
