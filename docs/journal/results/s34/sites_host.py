"""Python call sites of torch functions (and tensor methods) in one host-path adaptive save of the
demo delta, one thread: where the GIL's releases come from."""
import sys, tempfile, os, collections, threading, traceback
sys.path.insert(0, "/work/main/benchmarks")
import torch, lossy_speed, ckptzip
from ckptzip import parallel
depth = int(sys.argv[1]) if len(sys.argv) > 1 else 1
SKIP = {"__get__", "numel", "dim", "size", "shape", "dtype", "device", "is_cpu", "data_ptr", "element_size", "is_contiguous", "nbytes", "itemsize", "requires_grad", "is_cuda", "ndim", "layout", "is_floating_point", "__len__", "stride", "storage_offset"}
sites = collections.Counter(); names = collections.Counter(); total = [0]; lock = threading.Lock()
class Counter(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name not in SKIP:
            fr = [f for f in traceback.extract_stack(limit=10)[:-1] if "/ckptzip/" in f.filename]
            key = " < ".join(f"{f.filename.split('ckptzip/')[-1]}:{f.lineno} {f.name}" for f in fr[::-1][:depth]) if fr else "?"
            with lock: total[0] += 1; sites[key] += 1; names[name] += 1
        with torch._C.DisableTorchFunction():
            return func(*args, **(kwargs or {}))
orig = parallel._mark_pool_thread
def mark():
    orig(); Counter().__enter__()
parallel._mark_pool_thread = mark
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
with Counter():
    ckptzip.save(second, os.path.join(d, "d.ckz"), mode="adaptive", base=key, threads=1, resumed=True)
print("torch calls", total[0])
for k, v in sites.most_common(40): print(f"{v:6d} {k}")
print(names.most_common(30))
