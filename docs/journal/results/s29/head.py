import sys, time, os
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C, ckptzip.modes.bitsnap as B, ckptzip.reader as R
torch.set_num_threads(2)
d = "/tmp/s29/syn1.0"; key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(1.0)
ckptzip.save(first, key, threads=2); del first
ev = []
def wrap(obj, name):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); ev.append((name, t, time.perf_counter())); return r
    setattr(obj, name, g)
wrap(R.FileBase, "prefetch"); wrap(C.JointPolicy, "groups"); wrap(B.BitsnapPolicy, "survey"); wrap(C.JointPolicy, "_look"); wrap(B.BitsnapPolicy, "plan_group"); wrap(C.JointPolicy, "plan_state")
for rep in range(3):
    ev.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "h.ckz"), mode="bitsnap", base=key, threads=2, resumed=True)
    t1 = time.perf_counter()
    out = []
    for k in ("plan_state", "groups", "prefetch", "_look", "survey", "plan_group"):
        es = [e for e in ev if e[0] == k]
        if es: out.append(f"{k} {min(e[1] for e in es)-t0:.2f}-{max(e[2] for e in es)-t0:.2f} (n {len(es)}, busy {sum(e[2]-e[1] for e in es):.2f})")
    print(f"total {t1-t0:.2f} | " + " | ".join(out), flush=True)
