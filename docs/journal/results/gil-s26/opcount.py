import sys, time, tempfile, os, collections, traceback
sys.path.insert(0, "benchmarks")
import lossy_speed, ckptzip, torch
from torch.utils._python_dispatch import TorchDispatchMode
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
counts = collections.Counter(); where = collections.Counter()
class M(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        counts[str(func)] += 1
        fr = [f for f in traceback.extract_stack()[:-1] if "/ckptzip/" in f.filename]
        if fr: where[f"{os.path.basename(fr[-1].filename)}:{fr[-1].name}"] += 1
        return func(*args, **(kwargs or {}))
mode = sys.argv[1]
with M():
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=1, resumed=True)
print(mode, "torch ops:", sum(counts.values()))
for k, v in where.most_common(25): print(f"{v:6d} {k}")
