import time, torch, sys, ctypes
sys.path.insert(0, "/work/main/src")
from ckptzip import hostpath, _native
torch.set_num_threads(1)
n = 320 << 20
hold = []
def fill(x):
    t = time.perf_counter(); x.fill_(1.0); return n / (time.perf_counter() - t) / 1e9
pb = lambda: torch.frombuffer(_native.PageBuffer(n), dtype=torch.uint8).view(torch.float32)
te = lambda: torch.empty(n // 4, dtype=torch.float32)
mode = sys.argv[1]
for r in range(6):
    out = []
    for name, make in (("te", te), ("pb", pb)) if r % 2 else (("pb", pb), ("te", te)):
        x = make(); out.append(f"{name} {fill(x):.2f}")
        if mode == "hold": hold.append(x)
        else: del x
    print(" | ".join(out), flush=True)
