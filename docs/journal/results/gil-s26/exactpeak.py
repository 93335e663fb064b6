"""Exact peak of malloc'd bytes at op granularity on the torch path (host emulation of the GPU's allocator count)."""
import sys, ctypes, traceback, dataclasses, tempfile, os, threading
sys.path.insert(0, "benchmarks")
import lossy_speed, torch, ckptzip
from torch.utils._python_dispatch import TorchDispatchMode
from ckptzip.hostpath import torch_ops_only
from ckptzip.planning import prepare
from ckptzip.reader import open_base
from ckptzip.tree import flatten
libc = ctypes.CDLL("libc.so.6")
class MI2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena","ordblks","smblks","hblks","hblkhd","usmblks","fsmblks","uordblks","fordblks","keepcost")]
libc.mallinfo2.restype = MI2
def used():
    m = libc.mallinfo2(); return m.uordblks + m.hblkhd
mode = sys.argv[1]; side = int(sys.argv[2])
torch.set_num_threads(1)
first, second, _ = lossy_speed.square_states(side)
work = tempfile.mkdtemp(); key = os.path.join(work, "key.ckz")
ckptzip.save(first, key, threads=2); del first
state_bytes = sum(l.nbytes for l in flatten(second)[1])
base = open_base(key, threads=1)
names = [l.name for l in flatten(second)[1] if base.tensor(l.name) is not None]
base.prefetch(names)
for n in names: base.raw(n)
from ckptzip.modes.common import GroupValues
def on_device(self):
    return dataclasses.replace(self, w_base=None if self.w_base is None else self.w_base.clone(),
                               v_base=None if self.v_base is None else self.v_base.clone())
GroupValues.on_device = on_device
state = {"peak": 0, "where": None}
import weakref
live = {}
def short():
    fr = [l for l in traceback.format_stack()[:-2] if "/ckptzip/" in l]
    return " <- ".join(l.strip().split("\n")[0].replace('File "src/ckptzip/','').replace('", line ',':').split(", in ")[0] + " " + l.strip().split("\n")[0].split(", in ")[-1] for l in fr[-3:][::-1])
class Tracker(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for o in outs:
            if isinstance(o, torch.Tensor) and o.untyped_storage().nbytes() >= (1 << 20):
                try:
                    live[id(o)] = (weakref.ref(o), o.untyped_storage().data_ptr(), o.untyped_storage().nbytes(), str(func) + " @ " + short())
                except TypeError:
                    pass
        u = used()
        if u > state["peak"]:
            state["peak"] = u
            state["where"] = (str(func), short())
            seen = {}
            for k, (r, ptr, nb, where) in list(live.items()):
                if r() is None:
                    del live[k]; continue
                seen.setdefault(ptr, (nb, where))
            state["live"] = sorted(seen.values(), reverse=True)
        return out
import ckptzip.modes.common as C
_plan_group = {}
for cls in C.JointPolicy.__subclasses__():
    orig = cls.plan_group
    def wrapped(self, leaves, values, base, _orig=orig):
        with Tracker():
            return _orig(self, leaves, values, base)
    cls.plan_group = wrapped
before = used()
with torch_ops_only():
    prepared = prepare(second, mode=mode, base=base, resumed=True, threads=1)
print(f"{mode} {side}: state {state_bytes/1e6:.0f} MB, exact peak extra {(state['peak']-before)/1e6:.0f} MB = {(state['peak']-before)/state_bytes:.2f}x")
print(state["where"])
tot = sum(nb for nb, _ in state["live"])
print(f"tracked live (made inside plan_group) {tot/1e6:.0f} MB; untracked {(state['peak']-before-tot)/1e6:.0f} MB")
for nb, w in state["live"][:25]: print(f"{nb/1e6:7.1f} MB  {w}")
