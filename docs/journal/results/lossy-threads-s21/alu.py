import time, numpy as np, sys
import ckptzip._native as n
x = np.random.default_rng(0).standard_normal(1<<22).astype(np.float32)
t=time.perf_counter()
for _ in range(int(sys.argv[1])):
    y = x.copy(); n.sort_floats(y, 4)
print(sys.argv[2], f"{time.perf_counter()-t:.2f}s")
