import time, threading, numpy as np, torch
torch.set_num_threads(1)
a = torch.randn(1024, 1024); v = np.random.rand(4_000_000).astype(np.float32)
def work(kind, n):
    if kind == "mm":
        for _ in range(n): a @ a
    else:
        for _ in range(n): np.sort(v)
def timed(kind, threads, n):
    ts = [threading.Thread(target=work, args=(kind, n)) for _ in range(threads)]
    t = time.perf_counter()
    for x in ts: x.start()
    for x in ts: x.join()
    return time.perf_counter() - t
for r in range(3):
    out = []
    for kind, n in (("mm", 60), ("sort", 12)):
        one = timed(kind, 1, n); two = timed(kind, 2, n)
        out.append(f"{kind}: 1 thread {one:.2f}s, 2 threads x same work each {two:.2f}s -> {2*one/two:.2f}x")
    print(" | ".join(out), flush=True)
