"""Paired 2-thread saves of the demo delta, the planning threads pinned to one CPU each (os.sched_setaffinity on the thread) or not. usage: pin.py mode pairs"""
import sys, os, time, tempfile, shutil, statistics, threading, itertools
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip.modes import common
mode = sys.argv[1]; pairs = int(sys.argv[2])
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
PIN = [False]; counter = itertools.count(); allcpus = os.sched_getaffinity(0)
orig = common.by_task
def by_task(fn, sizes, threads, gate):
    def g(pos):
        if PIN[0] and not getattr(local, "pinned", False):
            os.sched_setaffinity(0, {next(counter) % 2}); local.pinned = True
        if not PIN[0] and getattr(local, "pinned", False):
            os.sched_setaffinity(0, allcpus); local.pinned = False
        return fn(pos)
    return orig(g, sizes, threads, gate)
local = threading.local()
common.by_task = by_task
for p in (False, True):
    PIN[0] = p; ckptzip.save(second, out, mode=mode, base=key, threads=2, resumed=True)
t = {False: [], True: []}
for i in range(pairs):
    for p in ((False, True) if i % 2 == 0 else (True, False)):
        PIN[0] = p
        s = time.perf_counter(); ckptzip.save(second, out, mode=mode, base=key, threads=2, resumed=True); t[p].append(time.perf_counter() - s)
dd = [b - a for a, b in zip(t[False], t[True])]
print(f"{mode}: unpinned median {statistics.median(t[False]):.3f}, pinned {statistics.median(t[True]):.3f}, pinned-unpinned median {statistics.median(dd):+.3f}, pinned faster {sum(x < 0 for x in dd)}/{pairs}")
shutil.rmtree(d)
