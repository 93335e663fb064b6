import sys, os, hashlib, torch
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip
torch.set_num_threads(1)
build = sys.argv[1]
d = "/tmp/s28/syn"; os.makedirs(d, exist_ok=True)
key = os.path.join(d, "k.ckz"); sec = os.path.join(d, "second.pt")
if not os.path.exists(sec):
    first, second, _ = lossy_speed.synthetic_states(0.25)
    ckptzip.save(first, key, threads=2); torch.save(second, sec)
second = torch.load(sec)
for mode in ("adaptive", "excp", "bitsnap"):
    for threads in (1, 2):
        p = os.path.join(d, f"id-{build}.ckz")
        ckptzip.save(second, p, mode=mode, base=key, threads=threads, resumed=True)
        print(mode, threads, hashlib.sha256(open(p, "rb").read()).hexdigest()[:16], flush=True)
