import sys, os, torch
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip
d = "/tmp/s31/demo"
first, second, _ = lossy_speed.demo_states(20, 5)
ckptzip.save(first, os.path.join(d, "k.ckz"), threads=2); torch.save(second, os.path.join(d, "second.pt"))
