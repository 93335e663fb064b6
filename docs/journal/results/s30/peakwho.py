import sys, os, gc, inspect, json
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main/benchmarks/probes")
import torch
torch.set_num_threads(1)
import lossy_speed, ckptzip
from peak_memory import malloc_in_use
from torch.utils._python_dispatch import TorchDispatchMode
from ckptzip.hostpath import torch_ops_only
from ckptzip.planning import prepare
from ckptzip.reader import open_base
side = int(sys.argv[1]); mode = sys.argv[2]
first, second, _ = lossy_speed.square_states(side)
key = f"/tmp/s30/sq{side}.ckz"
if not os.path.exists(key): ckptzip.save(first, key, threads=2)
del first
state_bytes = sum(t.numel() * t.element_size() for t in ckptzip.tree.flatten(second)[1] if isinstance(t, torch.Tensor)) if hasattr(ckptzip, "tree") else None
target = int(sys.argv[3]) if len(sys.argv) > 3 else -1
count = [0]; best = [0, -1]; report = []
class Mode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        count[0] += 1
        now = malloc_in_use()
        if now > best[0]:
            best[0], best[1] = now, count[0]
        if count[0] == target:
            seen = {}
            for fr in inspect.stack()[1:]:
                if "/ckptzip/" not in fr.filename: continue
                for name, v in fr.frame.f_locals.items():
                    vals = v if isinstance(v, (list, tuple)) else [v]
                    for x in vals:
                        if isinstance(x, torch.Tensor) and x.numel() * x.element_size() >= (1 << 20):
                            try: ptr = x.untyped_storage().data_ptr(); size = x.untyped_storage().nbytes()
                            except Exception: continue
                            seen.setdefault(ptr, (size, []))[1].append(f"{os.path.basename(fr.filename)}:{fr.function}.{name}")
            report.append((func, malloc_in_use(), seen))
        return out
base = open_base(key)
with torch_ops_only():
    start = malloc_in_use()
    with Mode():
        prepared = prepare(second, mode=mode, base=base, threads=1, resumed=True)
print("ops", count[0], "peak op", best[1], "peak extra MB", (best[0] - start) / 1e6)
for func, now, seen in report:
    print("at", func, "extra MB", (now - start) / 1e6)
    total = 0
    for ptr, (size, names) in sorted(seen.items(), key=lambda kv: -kv[1][0]):
        total += size
        print(f"  {size/1e6:8.1f} MB  {', '.join(dict.fromkeys(names))}")
    print("  named in frames:", total / 1e6, "MB")
