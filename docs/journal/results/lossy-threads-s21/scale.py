import sys, time, os, tempfile, shutil
from pathlib import Path
import torch, ckptzip, resource
import sys as _s
if os.environ.get("TUNE"): ckptzip.tune_malloc()
which = sys.argv[1]; n = int(sys.argv[2]); mode = sys.argv[3] if len(sys.argv) > 3 else "adaptive"
first, second = torch.load(f"/tmp/{which}_states.pt", weights_only=False)
d = Path(tempfile.mkdtemp(dir="/tmp"))
ckptzip.save(first, d / "k.ckz", threads=2)
raw = sum(t.numel() for t in second["model"].values()) * 12
res = {1: [], 2: []}; cpu = {1: [], 2: []}; wall = {1: [], 2: []}
for r in range(n):
    for th in (1, 2):
        torch.set_num_threads(th)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t, c = time.perf_counter(), time.process_time()
        ckptzip.save(second, d / "d.ckz", mode=mode, base=d / "k.ckz", threads=th)
        res[th].append(raw / (time.perf_counter() - t) / 1e6)
        cpu[th].append(time.process_time() - c); wall[th].append(time.perf_counter() - t)
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if r: print(th, f"user {ru1.ru_utime-ru0.ru_utime:.2f} sys {ru1.ru_stime-ru0.ru_stime:.2f} minflt {ru1.ru_minflt-ru0.ru_minflt} nvcsw {ru1.ru_nvcsw-ru0.ru_nvcsw} nivcsw {ru1.ru_nivcsw-ru0.ru_nivcsw}")
shutil.rmtree(d, ignore_errors=True)
r1, r2 = res[1][1:], res[2][1:]
print(os.environ.get("TAG", ""), which, mode, "1t", " ".join(f"{x:.0f}" for x in r1), "| 2t", " ".join(f"{x:.0f}" for x in r2),
      "| pair ratios", " ".join(f"{b/a:.2f}" for a, b in zip(r1, r2)), flush=True)
print("cpu/wall 1t", " ".join(f"{c/w:.2f}" for c, w in zip(cpu[1][1:], wall[1][1:])), "| 2t", " ".join(f"{c/w:.2f}" for c, w in zip(cpu[2][1:], wall[2][1:])), "| cpu 2t/1t", " ".join(f"{b/a:.2f}" for a, b in zip(cpu[1][1:], cpu[2][1:])))
