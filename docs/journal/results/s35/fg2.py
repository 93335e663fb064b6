import sys, time, tempfile, os, statistics
sys.path.insert(0, "benchmarks")
import lossy_speed, ckptzip, torch
torch.set_num_threads(1)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz")
ckptzip.save(first, key, threads=2)
import subprocess
res = {}
for rnd in range(3):
  for kind in ["none", "hash", "mem", "l2"]:
    p = None
    if kind != "none":
        p = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "bg.py"), kind, "30"]); time.sleep(0.3)
    for r in range(3):
        c = time.process_time()
        ckptzip.save(second, os.path.join(d, "d.ckz"), mode=sys.argv[1], base=key, threads=1, resumed=True)
        res.setdefault(kind, []).append(time.process_time() - c)
    if p: p.kill(); p.wait()
for k, v in res.items(): print(k, f"median cpu {statistics.median(v):.3f}", " ".join(f"{x:.2f}" for x in v))
