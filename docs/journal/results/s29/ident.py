import sys, os, hashlib, torch
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip
tt = int(sys.argv[2]); torch.set_num_threads(tt)
build = sys.argv[1]; modes = sys.argv[3].split(",")
for state in ("demo", "syn"):
    d = f"/tmp/s29/id-{state}"; os.makedirs(d, exist_ok=True)
    key = os.path.join(d, "k.ckz"); sec = os.path.join(d, "second.pt")
    if not os.path.exists(sec):
        first, second, _ = lossy_speed.synthetic_states(0.25) if state == "syn" else lossy_speed.demo_states(20, 5)
        ckptzip.save(first, key, threads=2); torch.save(second, sec)
    second = torch.load(sec)
    for mode in modes:
        for threads in (1, 2):
            p = os.path.join(d, f"id-{build}.ckz")
            ckptzip.save(second, p, mode=mode, base=key, threads=threads, resumed=True)
            print(state, mode, threads, hashlib.sha256(open(p, "rb").read()).hexdigest()[:16], flush=True)
