"""Which lines of the library make the torch calls of one lossy save of the demo delta on the
host (each call's result is a tensor the save makes and frees; freeing one lets go of the GIL
twice): a TorchFunctionMode counts them by the innermost ckptzip frame. usage: torch_sites.py MODE"""
import collections
import os
import sys
import tempfile

sys.path.insert(0, "benchmarks")
import torch
from torch.overrides import TorchFunctionMode

import ckptzip
import lossy_speed

mode = sys.argv[1]
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp()
key = os.path.join(d, "k.ckz")
ckptzip.save(first, key, threads=1)
ckptzip.save(second, os.path.join(d, "d.ckz"), mode=mode, base=key, threads=1, resumed=True)
sites: collections.Counter = collections.Counter()
ops: collections.Counter = collections.Counter()


class Count(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        frame = sys._getframe(1)
        while frame is not None and "/ckptzip/" not in frame.f_code.co_filename:
            frame = frame.f_back
        where = "?" if frame is None else (f"{frame.f_code.co_filename.split('/ckptzip/')[-1]}:"
                                           f"{frame.f_code.co_name}:{frame.f_lineno}")
        name = getattr(func, "__name__", str(func))
        sites[where] += 1
        ops[name] += 1
        return func(*args, **(kwargs or {}))


with Count():  # the mode is per thread: one thread, so every call is seen
    ckptzip.save(second, os.path.join(d, "d.ckz"), mode=mode, base=key, threads=1, resumed=True)
print(f"{mode}: {sum(sites.values())} torch calls")
for where, n in sites.most_common(40):
    print(f"{n:6d}  {where}")
print(ops.most_common(70))
