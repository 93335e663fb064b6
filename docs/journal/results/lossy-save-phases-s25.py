import sys, time, tempfile, os, threading, collections
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[3] / 'benchmarks'))
import torch, ckptzip
import ckptzip.writer as W, ckptzip.planning as P
import lossy_speed as L
modes = sys.argv[1].split(','); gb = float(sys.argv[2])
first, second, params = L.synthetic_states(gb) if gb > 0 else L.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, 'key.ckz'); ckptzip.save(first, key, mode='lossless')
T = collections.defaultdict(float)
orig_prepare = W.prepare
def prepare(*a, **k):
    t = time.perf_counter(); r = orig_prepare(*a, **k); T['prepare'] += time.perf_counter() - t; return r
W.prepare = prepare
# per-group plan busy time per thread
from ckptzip.modes import common as C
busy = collections.defaultdict(float)
orig_pg = {}
for cls in C.JointPolicy.__subclasses__() + [c for s in C.JointPolicy.__subclasses__() for c in s.__subclasses__()]:
    if 'plan_group' in cls.__dict__:
        f = cls.__dict__['plan_group']
        def wrap(self, *a, _f=f, **k):
            t = time.perf_counter(); r = _f(self, *a, **k); busy[threading.get_ident()] += time.perf_counter() - t; return r
        setattr(cls, 'plan_group', wrap)
for rnd in range(2):
    for mode in modes:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            T.clear(); busy.clear()
            t = time.perf_counter(); c = time.process_time()
            ckptzip.save(second, os.path.join(d, 'delta.ckz'), mode=mode, base=key, resumed=True, threads=threads)
            w = time.perf_counter() - t
            print(f"{mode:9s} t={threads} {params*12/w/1e6:5.0f} MB/s wall {w:.2f} cpu {time.process_time()-c:.2f} prepare {T['prepare']:.2f} rest {w-T['prepare']:.2f} plan-busy/thread {[round(v,2) for v in busy.values()]}", flush=True)
