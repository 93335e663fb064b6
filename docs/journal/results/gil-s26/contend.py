import sys, time, tempfile, os, threading
sys.path.insert(0, "benchmarks")
import numpy as np, lossy_speed, ckptzip, torch
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
rng = np.random.default_rng(0); arr = rng.standard_normal(2_000_000).astype(np.float32)
big = rng.standard_normal(32_000_000).astype(np.float32)
stop = threading.Event()
def bg_sort():
    while not stop.is_set(): np.sort(arr)
def bg_mem():
    out = np.empty_like(big)
    while not stop.is_set(): np.add(big, 1.0, out=out)
def bg_py():
    x = 0
    while not stop.is_set():
        for i in range(1000): x += i
def save():
    t = time.perf_counter(); ckptzip.save(second, os.path.join(d, "x.ckz"), mode="adaptive", base=key, threads=1, resumed=True); return time.perf_counter() - t
for rep in range(2):
    for name, bg in (("alone", None), ("beside C sort (GIL free)", bg_sort), ("beside memory streaming (GIL free)", bg_mem), ("beside pure Python (GIL)", bg_py)):
        stop.clear(); th = None
        if bg: th = threading.Thread(target=bg, daemon=True); th.start(); time.sleep(0.2)
        s = save()
        stop.set()
        if th: th.join()
        print(f"1-thread adaptive save {name}: {s:.2f}s", flush=True)
