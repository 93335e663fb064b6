import sys, os, torch, ckptzip
sys.path.insert(0, "/work/main/benchmarks"); import lossy_speed
d = "/tmp/s28/synab"; os.makedirs(d, exist_ok=True)
first, second, _ = lossy_speed.synthetic_states(1.0)
ckptzip.save(first, os.path.join(d, "k.ckz"), threads=2); torch.save(second, os.path.join(d, "second.pt"))
