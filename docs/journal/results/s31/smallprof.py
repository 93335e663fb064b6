import sys, time, os, cProfile, pstats
import ckptzip, torch
import ckptzip.modes.common as C
import ckptzip.modes.adaptive as A, ckptzip.modes.excp as E, ckptzip.modes.bitsnap as B
torch.set_num_threads(1)
d = "/tmp/s31/demo"; key = os.path.join(d, "k.ckz"); second = torch.load(os.path.join(d, "second.pt"))
mode = sys.argv[1]
pol = [v for m in (A, E, B) for v in vars(m).values() if isinstance(v, type) and issubclass(v, C.JointPolicy) and getattr(v, "mode", None) == mode and "plan_group" in vars(v)][0]
prof = cProfile.Profile(); f = pol.plan_group; tot = [0.0, 0]
def g(*a, **k):
    small = sum(a[1][i].nbytes for i in a[2].group.members()) < 512*1024
    if small:
        t = time.perf_counter(); prof.enable(); r = f(*a, **k); prof.disable(); tot[0] += time.perf_counter() - t; tot[1] += 1
        return r
    return f(*a, **k)
pol.plan_group = g
for rep in range(3):
    ckptzip.save(second, os.path.join(d, "sp.ckz"), mode=mode, base=key, threads=1, resumed=True)
print("small groups", tot[1], "time", round(tot[0], 3))
st = pstats.Stats(prof); st.sort_stats(sys.argv[2] if len(sys.argv) > 2 else "tottime").print_stats(35)
