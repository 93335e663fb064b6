import sys, time, os, tempfile, shutil
from pathlib import Path
import torch, ckptzip
which = sys.argv[1]; n = int(sys.argv[2]); th = int(sys.argv[3]); mode = sys.argv[4] if len(sys.argv) > 4 else "adaptive"
first, second = torch.load(f"/tmp/{which}_states.pt", weights_only=False)
torch.set_num_threads(th)
d = Path(tempfile.mkdtemp(dir="/tmp"))
ckptzip.save(first, d / "k.ckz", threads=th)
raw = sum(t.numel() for t in second["model"].values()) * 12
ws = []
for r in range(n):
    t = time.perf_counter()
    ckptzip.save(second, d / "d.ckz", mode=mode, base=d / "k.ckz", threads=th)
    ws.append(time.perf_counter() - t)
shutil.rmtree(d, ignore_errors=True)
print(which, mode, th, " ".join(f"{raw/w/1e6:.0f}" for w in ws), flush=True)
