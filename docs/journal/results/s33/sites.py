"""Python call sites of torch functions in a lossy prepare on torch's path (host tensors), all
pool threads included: where the device path's launches and syncs come from."""
import sys, tempfile, collections, threading, traceback
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch
import lossy_speed, ckptzip
from ckptzip import hostpath, parallel
from ckptzip.planning import prepare
from ckptzip.reader import open_base
gb = float(sys.argv[1]); mode = sys.argv[2]; depth = int(sys.argv[3]) if len(sys.argv) > 3 else 1
SKIP = {"__get__", "untyped_storage", "numel", "storage_offset", "stride", "dim", "size", "shape", "dtype", "device", "is_cpu", "data_ptr", "element_size", "is_contiguous", "nbytes", "itemsize", "is_floating_point", "__len__", "requires_grad", "layout", "is_cuda", "ndim"}
SYNC = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy"}
lock = threading.Lock()
nbytes = collections.Counter()
sites = collections.Counter(); syncs = collections.Counter(); total = [0, 0]
class Counter(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name not in SKIP:
            fr = [f for f in traceback.extract_stack(limit=12)[:-1] if "/ckptzip/" in f.filename]
            key = " < ".join(f"{f.filename.split('ckptzip/')[-1]}:{f.lineno} {f.name}" for f in fr[::-1][:depth]) if fr else "?"
            with lock:
                total[0] += 1; sites[key] += 1
                if name in SYNC: total[1] += 1; syncs[f"{name} {key}"] += 1
                if name in ("cpu", "to") and args and isinstance(args[0], torch.Tensor):
                    nbytes[f"{name} {key}"] += args[0].nbytes
        with torch._C.DisableTorchFunction():
            return func(*args, **(kwargs or {}))
orig = parallel._mark_pool_thread
def mark():
    orig(); Counter().__enter__()
parallel._mark_pool_thread = mark
first, second, params = lossy_speed.synthetic_states(gb)
with tempfile.TemporaryDirectory() as work:
    key = Path(work) / "k.ckz"; ckptzip.save(first, key)
    with hostpath.torch_ops_only():
        base = open_base(key)
        with Counter():
            prepare(second, mode=mode, base=base, resumed=True, threads=2)
print(f"{mode} {params/1e6:.1f}M: torch calls {total[0]}, syncs {total[1]}")
for k, v in sites.most_common(40): print(f"{v:6d} {k}")
print("-- syncs")
for k, v in syncs.most_common(25): print(f"{v:6d} {k}")
print("-- bytes through cpu()/to()")
for k, v in nbytes.most_common(15): print(f"{v/1e6:9.1f} MB {k}")
