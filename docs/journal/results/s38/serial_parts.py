"""The parts of a save of the demo delta outside the plans, timed (ms): opening the base, flattening, the header, the sink, fsync, rename. usage: serial_parts.py mode threads"""
import sys, os, time, tempfile, shutil, collections
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
from ckptzip import api, sinks, writer, planning, storage, reader
from ckptzip.modes import common
mode = sys.argv[1]; threads = int(sys.argv[2])
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
acc = collections.defaultdict(float)
def wrapf(owner, name, tag=None):
    f = getattr(owner, name)
    def w(*a, **k):
        s = time.perf_counter()
        try: return f(*a, **k)
        finally: acc[tag or name] += time.perf_counter() - s
    setattr(owner, name, w)
wrapf(api, "open_base"); wrapf(api, "encode_state"); wrapf(os, "fsync"); wrapf(os, "replace")
wrapf(writer, "prepare"); wrapf(common.JointPolicy, "plan_state"); wrapf(planning, "flatten"); wrapf(planning, "_encoded_plan")
wrapf(writer, "finish_header"); wrapf(writer, "_tasks"); wrapf(writer, "new_header"); wrapf(writer, "_header_estimate")
wrapf(common.JointPolicy, "_candidate_groups"); wrapf(common.JointPolicy, "observe_state"); wrapf(planning, "chain_base")
for n, c in vars(sinks).items():
    if isinstance(c, type):
        for m in ("finish", "reserve"):
            if m in vars(c): wrapf(c, m, n + "." + m)
for i in range(5):
    acc.clear()
    s = time.perf_counter(); r = ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True); e = time.perf_counter() - s
    if i: print(f"save {e*1000:.1f} " + " ".join(f"{k} {v*1000:.1f}" for k, v in acc.items()))
shutil.rmtree(d)
