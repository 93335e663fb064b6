import os, time, ctypes, sys, numpy as np
libc = ctypes.CDLL("libc.so.6", use_errno=True)
libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint]
WRITE = 2
data = np.random.default_rng(0).integers(0, 255, 4 << 20, dtype=np.uint8).tobytes()
mb = int(sys.argv[1]); every = int(sys.argv[2]) << 20
for rep in range(3):
    for mode in ("plain", "srange"):
        path = f"/tmp/s29/fs.{mode}"
        t = time.perf_counter()
        with open(path, "wb") as f:
            done = last = 0
            for i in range(mb // 4):
                f.write(data); done += len(data)
                if mode == "srange" and done - last >= every:
                    f.flush(); libc.sync_file_range(f.fileno(), last, done - last, WRITE); last = done
            t1 = time.perf_counter(); f.flush(); os.fsync(f.fileno())
        t2 = time.perf_counter()
        print(f"{mode:6s} {mb} MB: write {t1-t:.3f}s fsync {t2-t1:.3f}s total {t2-t:.3f}s")
        os.unlink(path)
