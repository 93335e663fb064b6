import sys, time, os, resource, collections, threading
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip.modes.common as C, ckptzip.modes.excp as E, ckptzip.modes.bitsnap as B, ckptzip.writer as W, ckptzip.reader as R
gb = float(sys.argv[1]); mode = sys.argv[2]; threads = int(sys.argv[3]); torch.set_num_threads(threads)
d = f"/tmp/s29/syn{gb}"; key = os.path.join(d, "k.ckz")
first, second, params = lossy_speed.synthetic_states(gb)
ckptzip.save(first, key, threads=2); del first
F = collections.Counter(); T = collections.Counter()
def wrap(obj, name, label):
    f = getattr(obj, name)
    def g(*a, **k):
        r0 = resource.getrusage(resource.RUSAGE_THREAD); t = time.perf_counter()
        try: return f(*a, **k)
        finally:
            r1 = resource.getrusage(resource.RUSAGE_THREAD)
            F[label] += r1.ru_minflt - r0.ru_minflt; T[label] += time.perf_counter() - t
    setattr(obj, name, g)
for spec in sys.argv[4].split(","):
    modname, attr = spec.rsplit(".", 1)
    obj = eval(modname)
    wrap(obj, attr, spec)
for rep in range(3):
    F.clear(); T.clear()
    r0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
    ckptzip.save(second, os.path.join(d, "f.ckz"), mode=mode, base=key, threads=threads, resumed=True)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{mode} t{threads} total {time.perf_counter()-t:.2f}s minflt {r1.ru_minflt-r0.ru_minflt} sys {r1.ru_stime-r0.ru_stime:.2f} | " + ", ".join(f"{k} {v} ({T[k]:.2f}s)" for k, v in F.most_common()), flush=True)
