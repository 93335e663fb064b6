import os, time
from concurrent.futures import ThreadPoolExecutor
N = 300 << 20; chunk = 8 << 20
data = [os.urandom(chunk) for _ in range(N // chunk)]
pool = ThreadPoolExecutor(2)
k = 0
def run(threads):
    global k
    k += 1; p = f"/tmp/s30/pw{k}.bin"
    fd = os.open(p, os.O_CREAT | os.O_TRUNC | os.O_WRONLY)
    t = time.perf_counter()
    if threads == 1:
        for i, d in enumerate(data): os.pwrite(fd, d, i * chunk)
    else:
        list(pool.map(lambda i: os.pwrite(fd, data[i], i * chunk), range(len(data))))
    w = time.perf_counter() - t
    os.close(fd)
    return w
for r in range(3):
    print(" ".join(f"t{th} {run(th):.3f}" for th in (1, 2, 2, 1)), flush=True)
for i in range(1, k + 1): os.unlink(f"/tmp/s30/pw{i}.bin")
