"""The torch calls (attribute-like ones left out) and native calls of one 1-thread delta save of the demo
state, by the size of their largest tensor argument; the sites of the calls on tensors under 64K
elements (numpy() and contiguous() left out). usage: torch_calls.py mode"""
import sys, os, tempfile, shutil, collections, traceback
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from torch.overrides import TorchFunctionMode
from ckptzip import _native
mode = sys.argv[1]
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
SKIP = {"__get__", "numel", "is_contiguous", "element_size", "dim", "is_floating_point", "device", "is_neg", "untyped_storage", "storage_offset", "stride", "__bool__", "__float__", "__len__", "size", "data_ptr"}
bysite = collections.Counter(); bysize = collections.Counter()
class M(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name not in SKIP:
            n = max([a.numel() for a in args if isinstance(a, torch.Tensor)] or [0])
            f = traceback.extract_stack(limit=3)[0]
            if n < 65536 and name not in ("numpy", "contiguous"): bysite[(f.filename.split("ckptzip/")[-1], f.lineno, name)] += 1
            bysize["<1K" if n < 1024 else "<64K" if n < 65536 else "big"] += 1
        return func(*args, **kwargs)
nat = collections.Counter()
for nm in dir(_native):
    f = getattr(_native, nm)
    if callable(f) and not isinstance(f, type):
        def w(*a, _f=f, _n=nm, **k):
            nat[_n] += 1; return _f(*a, **k)
        setattr(_native, nm, w)
with M():
    ckptzip.save(second, out, mode=mode, base=key, threads=1, resumed=True)
print("torch calls by the size of their largest tensor:", dict(bysize), "| calls on tensors under 64K elements, numpy() and contiguous() left out:", sum(bysite.values()))
for k, v in bysite.most_common(40): print(f"{v:6d} {k}")
print("native", sum(nat.values())); print(nat.most_common(25))
shutil.rmtree(d)
