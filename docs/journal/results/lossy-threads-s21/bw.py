import time, numpy as np, sys
import ckptzip._native as n
x = np.ones(1<<26, dtype=np.float32)  # 256 MB
y = np.ones(1<<26, dtype=np.float32)
n.sum_squares(x, y, 4)
t=time.perf_counter()
for _ in range(int(sys.argv[1])):
    n.sum_squares(x, y, 4)
dt=time.perf_counter()-t
print(sys.argv[2], f"{int(sys.argv[1])*2*x.nbytes/dt/1e9:.1f} GB/s")
