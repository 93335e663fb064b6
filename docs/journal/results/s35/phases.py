import sys, time, tempfile, os, threading
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C, ckptzip.writer as W, ckptzip.sinks as S, ckptzip.planning as P
from ckptzip.modes import adaptive
mode = sys.argv[1]; threads = int(sys.argv[2]); torch.set_num_threads(threads)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
E = []; lock = threading.Lock()
def mark(name, f):
    def g(*a, **k):
        t = time.perf_counter(); c = time.thread_time(); r = f(*a, **k)
        with lock: E.append((t, time.perf_counter(), time.thread_time() - c, threading.current_thread().name[-2:], name))
        return r
    return g
W.prepare = mark("prepare", W.prepare)
C.JointPolicy.plan_state = mark("plan_state", C.JointPolicy.plan_state)
P.flatten = mark("flatten", P.flatten)
orig_pg = type(ckptzip.modes.common).__dict__  # noop
from ckptzip.modes import excp, bitsnap
for cls in (adaptive.AdaptivePolicy, excp.ExcpPolicy, bitsnap.BitsnapPolicy):
    cls.plan_group = mark("group", cls.plan_group)
C.JointPolicy._look = mark("look", C.JointPolicy._look)
C.precode = mark("precode", C.precode)
W._encode_task = mark("encode_task", W._encode_task)
W.finish_header = mark("finish_header", W.finish_header)
S.FileSink.finish = mark("sink_finish", S.FileSink.finish)
S.FileSink.reserve = mark("sink_reserve", S.FileSink.reserve)
W.plan_leaf = mark("plan_leaf", W.plan_leaf)
for r in range(4):
    E.clear(); t0 = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "x.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    t1 = time.perf_counter()
    agg = {}
    for a, b, c, th, n in E:
        x = agg.setdefault(n, [0, 0.0, 0.0, 9, 0]); x[0] += 1; x[1] += b - a; x[2] += c; x[3] = min(x[3], a - t0); x[4] = max(x[4], b - t0)
    print(f"== {mode} t{threads} total {t1-t0:.3f}")
    for n, (k, w, c, s, e) in agg.items():
        print(f"   {n:14s} n={k:4d} wall {w:.3f} cpu {c:.3f} span {s:.3f}-{e:.3f}")
