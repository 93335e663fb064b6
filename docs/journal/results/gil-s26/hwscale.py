import numpy as np, time, threading, torch
torch.set_num_threads(1)
rng = np.random.default_rng(0)
arrs = [rng.standard_normal(4_000_000).astype(np.float32) for _ in range(8)]
def work_sort(a): np.sort(a)
def work_exp(a): np.exp(a)  # elementwise, memory+compute
def work_mm(a): 
    m = torch.from_numpy(a[:1_000_000].reshape(1000, 1000)); (m @ m)
for name, fn in (("sort", work_sort), ("exp", work_exp), ("matmul", work_mm)):
    for rep in range(3):
        t = time.perf_counter()
        for a in arrs: fn(a)
        one = time.perf_counter() - t
        t = time.perf_counter()
        ths = [threading.Thread(target=lambda part=arrs[i::2]: [fn(a) for a in part]) for i in range(2)]
        [x.start() for x in ths]; [x.join() for x in ths]
        two = time.perf_counter() - t
        print(f"{name}: 1 thread {one:.3f}s, 2 threads {two:.3f}s, scaling {one/two:.2f}x", flush=True)
