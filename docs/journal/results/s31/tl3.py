import sys, time, os, threading
import ckptzip, torch
import ckptzip.modes.common as C
import ckptzip.modes.adaptive as A, ckptzip.modes.excp as E, ckptzip.modes.bitsnap as B
torch.set_num_threads(1)
d = "/tmp/s31/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
mode = sys.argv[1]
pol = [v for m in (A, E, B) for v in vars(m).values() if isinstance(v, type) and issubclass(v, C.JointPolicy) and getattr(v, "mode", None) == mode and "plan_group" in vars(v)][0]
ev = []
def wrap(obj, name, kind):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); ev.append((threading.get_ident(), kind(a), t, time.perf_counter())); return r
    setattr(obj, name, g)
wrap(pol, "plan_group", lambda a: "S" if sum(a[1][i].nbytes for i in a[2].group.members()) < 512*1024 else "L")
if hasattr(C, "precode"): wrap(C, "precode", lambda a: "C")
wrap(C.JointPolicy, "_look", lambda a: "l") if hasattr(C.JointPolicy, "_look") else None
for rep in range(4):
    ev.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "tl3.ckz"), mode=mode, base=key, threads=2, resumed=True)
    t1 = time.perf_counter(); out = []
    for th in sorted({e[0] for e in ev}):
        es = [e for e in ev if e[0] == th]
        desc = []
        for k in "LSCl":
            ks = [e for e in es if e[1] == k]
            if ks: desc.append(f"{k}x{len(ks)} {min(e[2] for e in ks)-t0:.3f}-{max(e[3] for e in ks)-t0:.3f} busy {sum(e[3]-e[2] for e in ks):.3f}")
        out.append(", ".join(desc))
    print(f"total {t1-t0:.3f} | " + " | ".join(out), flush=True)
