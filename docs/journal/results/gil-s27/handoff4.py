import threading, time, torch, sys, numpy as np, multiprocessing as mp
torch.set_num_threads(1)
def work(kind, n, q=None):
    size = {"200k": 200000, "2M": 2000000, "20k": 20000}[kind]
    y = torch.zeros(size); o = torch.empty(size)
    reps = n * 200000 // size
    t = time.perf_counter()
    for _ in range(reps):
        torch.add(y, 1.0, out=o)
    dt = time.perf_counter() - t
    if q is not None: q.put(dt)
    return dt
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    for kind in ("20k", "200k", "2M"):
        one = work(kind, 20000)
        res = []
        ts = [threading.Thread(target=lambda: res.append(work(kind, 20000))) for _ in range(2)]
        [th.start() for th in ts]; [th.join() for th in ts]
        q = ctx.Queue(); ps = [ctx.Process(target=work, args=(kind, 20000, q)) for _ in range(2)]
        [p.start() for p in ps]; pr = [q.get(), q.get()]; [p.join() for p in ps]
        print(f"add {kind} out=: alone {one:.2f}s; 2 threads each {res[0]:.2f},{res[1]:.2f}s; 2 procs each {pr[0]:.2f},{pr[1]:.2f}s", flush=True)
