import os, time, threading, numpy as np, torch
torch.set_num_threads(1)
N = 300 << 20; chunk = 8 << 20
data = [os.urandom(chunk) for _ in range(N // chunk)]
a = torch.randn(1024, 1024)
k = [0]
def compute(seconds_box, stop):
    n = 0; t = time.perf_counter()
    while not stop.is_set():
        a @ a; n += 1
    seconds_box.append((n, time.perf_counter() - t))
def write():
    k[0] += 1; p = f"/tmp/s30/ov{k[0]}.bin"
    fd = os.open(p, os.O_CREAT | os.O_TRUNC | os.O_WRONLY)
    t = time.perf_counter()
    for i, d in enumerate(data): os.pwrite(fd, d, i * chunk)
    os.close(fd); return time.perf_counter() - t
def run(with_write, computes):
    stop = threading.Event(); boxes = [[] for _ in range(computes)]
    ts = [threading.Thread(target=compute, args=(b, stop)) for b in boxes]
    for t in ts: t.start()
    if with_write: w = write()
    else: time.sleep(0.6); w = 0
    stop.set()
    for t in ts: t.join()
    rate = sum(n / s for n, s in (b[0] for b in boxes))
    return w, rate
for r in range(3):
    out = []
    for ww, c in ((False, 1), (True, 1), (False, 2), (True, 2), (True, 0)):
        w, rate = run(ww, c); out.append(f"write={ww} compute={c}: w {w:.2f}s mm/s {rate:.0f}")
    print(" | ".join(out), flush=True)
for i in range(1, k[0] + 1): os.unlink(f"/tmp/s30/ov{i}.bin")
