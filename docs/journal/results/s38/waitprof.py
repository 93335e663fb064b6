"""Where the planning threads wait: the groups' plans profiled per thread (cProfile) with a wall clock, or with the thread's CPU clock (4 saves of the demo delta); the difference per function is time spent waiting. usage: waitprof.py mode threads wall|cpu (writes /tmp/wp-MODE-THREADS-CLOCK.prof)"""
import sys, os, time, tempfile, shutil, threading, cProfile, pstats, io
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.modes import adaptive, common, excp as _e, bitsnap as _b
mode = sys.argv[1]; threads = int(sys.argv[2]); timer = {"wall": time.perf_counter, "cpu": time.thread_time}[sys.argv[3]]
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
profs = []; local = threading.local()
f = common.JointPolicy.plan_state
orig_by_task = common.by_task
def by_task(fn, sizes, threads, gate):
    def g(pos):
        p = getattr(local, "p", None)
        if p is None:
            p = local.p = cProfile.Profile(timer); profs.append(p)
        p.enable()
        try: return fn(pos)
        finally: p.disable()
    return orig_by_task(g, sizes, threads, gate)
common.by_task = by_task
ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True)
for p in profs: p.clear()
for i in range(4): ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True)
st = pstats.Stats(profs[0])
for p in profs[1:]: st.add(p)
st.dump_stats(f"/tmp/wp-{mode}-{threads}-{sys.argv[3]}.prof")
shutil.rmtree(d)
