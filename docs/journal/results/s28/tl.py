import sys, time, tempfile, os, threading
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(dir="/tmp/s28"); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
mode = sys.argv[1]
cls = {"adaptive": "AdaptivePolicy"}
import ckptzip.modes.adaptive as A, ckptzip.modes.excp as E, ckptzip.modes.bitsnap as B
pol = [v for m in (A, E, B) for v in vars(m).values() if isinstance(v, type) and issubclass(v, C.JointPolicy) and getattr(v, "mode", None) == mode and "plan_group" in vars(v)][0]
orig = pol.plan_group; ev = []
def pg(self, leaves, values, base):
    n = sum(leaves[i].nbytes for i in values.group.members())
    t = time.perf_counter(); c = time.thread_time(); r = orig(self, leaves, values, base)
    ev.append((threading.get_ident(), t, time.perf_counter(), time.thread_time() - c, n)); return r
pol.plan_group = pg
frac = float(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
orig_pt = C.plan_tasks
def plan_tasks(sizes, threads):
    tasks = orig_pt(sizes, threads)
    if threads <= 1 or frac is None or len(tasks[-1]) <= 1: return tasks
    large, small = tasks[:-1], tasks[-1]
    total = sum(sizes[t[0]] for t in large); acc = 0
    for i, t in enumerate(large):
        if acc >= frac * total: break
        acc += sizes[t[0]]
    return [*large[:i], small, *large[i:]]
C.plan_tasks = plan_tasks
for rep in range(4):
    ev.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=2, resumed=True)
    t1 = time.perf_counter()
    ths = sorted({e[0] for e in ev}); line = []
    for th in ths:
        es = [e for e in ev if e[0] == th]
        big = [e for e in es if e[4] >= 512*1024]; sm = [e for e in es if e[4] < 512*1024]
        busy = sum(e[2]-e[1] for e in es); cpu = sum(e[3] for e in es)
        line.append(f"th: first {min(e[1] for e in es)-t0:.3f} last {max(e[2] for e in es)-t0:.3f} busy {busy:.3f} cpu {cpu:.3f} big {len(big)} small {len(sm)}" + (f" small span {min(e[1] for e in sm)-t0:.3f}-{max(e[2] for e in sm)-t0:.3f} small busy {sum(e[2]-e[1] for e in sm):.3f} cpu {sum(e[3] for e in sm):.3f}" if sm else ""))
    print(f"total {t1-t0:.3f} | " + " | ".join(line), flush=True)
