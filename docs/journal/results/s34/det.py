import sys, tempfile, os, hashlib
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz")
ckptzip.save(first, key, threads=2)
for mode in sys.argv[1].split(","):
  for tt in (1, 2):
    torch.set_num_threads(tt)
    for ct in (1, 2):
        out = os.path.join(d, "d.ckz")
        ckptzip.save(second, out, mode=mode, base=key, threads=ct, resumed=True)
        print(mode, "torch", tt, "ckptzip", ct, hashlib.sha256(open(out, "rb").read()).hexdigest()[:12], flush=True)
