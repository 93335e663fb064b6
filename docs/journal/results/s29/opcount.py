import sys, os, collections, tempfile
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from torch.utils._python_dispatch import TorchDispatchMode
import ckptzip.modes.common as C
torch.set_num_threads(1)
mode = sys.argv[1]
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=1)
counts = collections.Counter(); kinds = collections.Counter()
class Count(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        f = sys._getframe(1); chain = []
        while f is not None and len(chain) < 2:
            if "/ckptzip/" in f.f_code.co_filename: chain.append(f"{os.path.basename(f.f_code.co_filename)}:{f.f_code.co_name}")
            f = f.f_back
        counts[" < ".join(chain)] += 1; kinds[str(func)] += 1
        return func(*args, **(kwargs or {}))
with Count():
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=1, resumed=True)
print("total", sum(counts.values()))
for k, v in counts.most_common(40): print(f"{v:6d} {k}")
print("-- ops"); 
for k, v in kinds.most_common(25): print(f"{v:6d} {k}")
