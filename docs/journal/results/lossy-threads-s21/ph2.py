import sys, time, tempfile, shutil, functools, collections, os
from pathlib import Path
import torch, ckptzip
from ckptzip import writer, sinks, storage
which, mode = sys.argv[1], sys.argv[2]
first, second = torch.load(f"/tmp/{which}_states.pt", weights_only=False)
T = collections.defaultdict(float)
def timed(obj, name, label):
    f = getattr(obj, name)
    @functools.wraps(f)
    def g(*a, **k):
        t = time.perf_counter()
        try: return f(*a, **k)
        finally: T[label] += time.perf_counter() - t
    setattr(obj, name, g)
timed(writer, "prepare", "prepare")
timed(writer, "encode_state", "encode_state")
timed(writer, "_encode_task", "encode_tasks(sum)")
timed(writer, "finish_header", "finish_header")
timed(writer, "_header_estimate", "header_estimate")
timed(sinks.FileSink, "finish", "sink.finish")
timed(os, "fsync", "fsync")
d = Path(tempfile.mkdtemp(dir="/tmp"))
ckptzip.save(first, d / "k.ckz", threads=2)
for th in (1, 2, 1, 2, 1, 2):
    torch.set_num_threads(th)
    T.clear()
    t = time.perf_counter()
    ckptzip.save(second, d / "d.ckz", mode=mode, base=d / "k.ckz", threads=th)
    total = time.perf_counter() - t
    print(th, f"total {total:.3f}", " ".join(f"{k} {v:.3f}" for k, v in T.items()))
shutil.rmtree(d)
