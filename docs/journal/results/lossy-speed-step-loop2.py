import sys, time, os, tempfile, shutil, resource
from pathlib import Path
import torch, ckptzip
which = sys.argv[1]; n = int(sys.argv[2]); th = int(sys.argv[3]); mode = sys.argv[4] if len(sys.argv) > 4 else "adaptive"
first, second = torch.load(f"/tmp/{which}_states.pt", weights_only=False)
torch.set_num_threads(th)
d = Path(tempfile.mkdtemp(dir="/tmp"))
ckptzip.save(first, d / "k.ckz", threads=th)
raw = sum(t.numel() for t in second["model"].values()) * 12
out = []
for r in range(n):
    ru0 = resource.getrusage(resource.RUSAGE_SELF); t = time.perf_counter()
    ckptzip.save(second, d / "d.ckz", mode=mode, base=d / "k.ckz", threads=th)
    w = time.perf_counter() - t; ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    sy = ru1.ru_stime - ru0.ru_stime
    out.append(f"{raw/w/1e6:.0f}MB/s cpu{cpu/w:.2f} sys{sy/cpu:.0%} flt{ru1.ru_minflt-ru0.ru_minflt} cs{ru1.ru_nvcsw-ru0.ru_nvcsw}/{ru1.ru_nivcsw-ru0.ru_nivcsw} cpus{cpu:.3f}")
shutil.rmtree(d, ignore_errors=True)
print(which, mode, th); print("\n".join(out[1:]), flush=True)
