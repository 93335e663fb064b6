import sys, time, tempfile, shutil, functools, collections
from pathlib import Path
import torch, ckptzip
from ckptzip.modes import common
from ckptzip import planning, writer, reader
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
timed(common.JointPolicy, "groups", "groups")
timed(common.JointPolicy, "plan_state", "plan_state")
timed(planning, "prepare", "prepare")
timed(reader.FileBase, "prefetch", "prefetch")
from ckptzip import container, sinks, api
timed(writer, "encode_state", "encode_state")
timed(writer, "prepare", "prepare")
timed(container, "finish_header", "finish_header")
timed(writer, "_header_estimate", "header_estimate")
timed(api, "open_base", "open_base") if hasattr(api, "open_base") else None
timed(reader.CheckpointFile, "open", "ckf_open")
d = Path(tempfile.mkdtemp(dir="/tmp"))
ckptzip.save(first, d / "k.ckz", threads=2)
for th in (1, 2, 1, 2, 1, 2):
    torch.set_num_threads(th)
    T.clear()
    t = time.perf_counter()
    ckptzip.save(second, d / "d.ckz", mode=mode, base=d / "k.ckz", threads=th)
    total = time.perf_counter() - t
    print(th, f"total {total:.2f}", " ".join(f"{k} {v:.2f}" for k, v in T.items()))
shutil.rmtree(d)
