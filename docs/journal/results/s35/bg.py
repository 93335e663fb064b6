import sys, numpy as np, hashlib, time
kind = sys.argv[1]; end = time.time() + float(sys.argv[2])
a = np.ones(1<<16, np.uint8)
out = np.empty(8<<20, np.float32); b = np.ones(8<<20, np.float32)
c = np.ones(1<<18, np.float32); o2 = np.empty_like(c)
while time.time() < end:
    if kind == "hash":
        for _ in range(100): hashlib.sha256(a).digest()
    elif kind == "mem":
        for _ in range(10): np.add(b, 1.0, out=out)
    elif kind == "l2":
        for _ in range(100): np.add(c, 1.0, out=o2)
