import os, time, threading, sys
from concurrent.futures import ThreadPoolExecutor
N = 300 << 20; chunk = 8 << 20
data = [os.urandom(chunk) for _ in range(N // chunk)]
pool = ThreadPoolExecutor(2)
def run(threads):
    p = "/tmp/s30/pw.bin"
    fd = os.open(p, os.O_CREAT | os.O_TRUNC | os.O_WRONLY)
    t = time.perf_counter()
    if threads == 1:
        for i, d in enumerate(data): os.pwrite(fd, d, i * chunk)
    else:
        list(pool.map(lambda i: os.pwrite(fd, data[i], i * chunk), range(len(data))))
    w = time.perf_counter() - t
    os.close(fd); os.unlink(p)
    return w
for r in range(4):
    print(" ".join(f"t{th} {run(th):.3f}" for th in (1, 2, 2, 1)), flush=True)
