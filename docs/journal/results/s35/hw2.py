import numpy as np, time, threading, hashlib
rng = np.random.default_rng(0)
def work_sort(a):
    for _ in range(100): b = np.sort(a)
def work_hash(a):
    for _ in range(400): hashlib.sha256(a).digest()
def work_mem(a):
    out = np.empty(8<<20, np.float32); b = np.ones(8<<20, np.float32)
    for _ in range(40): np.add(b, 1.0, out=out)
def run(fn, n):
    arrs = [rng.standard_normal(1<<18).astype(np.float32) for _ in range(n)]
    t = time.perf_counter()
    ths = [threading.Thread(target=fn, args=(x,)) for x in arrs]
    [x.start() for x in ths]; [x.join() for x in ths]
    return time.perf_counter() - t
for fn in (work_sort, work_hash, work_mem):
    s = []
    for rep in range(5):
        t1 = run(fn, 1); t2 = run(fn, 2); s.append(2*t1/t2)
    print(fn.__name__, f"t1 {t1:.2f}s scaling", " ".join(f"{x:.2f}" for x in s))
