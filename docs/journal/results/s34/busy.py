"""Samples every thread's run time (schedstat, ns) of this process every ~2 ms from a separate
process, over N saves; prints the histogram of busy cores over each save's wall time."""
import sys, time, tempfile, os, subprocess, json
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
threads = int(sys.argv[1]); mode = sys.argv[2]; reps = int(sys.argv[3])
torch.set_num_threads(threads)
first, second, _ = lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz")
ckptzip.save(first, key, threads=2)
out = os.path.join(d, "d.ckz")
ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True)
sampler = subprocess.Popen([sys.executable, "-c", f"""
import os, time, sys
pid = {os.getpid()}; rows = []
t_end = time.time() + 120
while time.time() < t_end:
    t = time.monotonic_ns(); s = {{}}
    try:
        for tid in os.listdir(f"/proc/{{pid}}/task"):
            try: s[tid] = int(open(f"/proc/{{pid}}/task/{{tid}}/schedstat").read().split()[0])
            except OSError: pass
    except OSError: break
    rows.append((t, s))
    if os.path.exists("/tmp/s34/busy.stop"): break
    time.sleep(0.001)
import json; json.dump(rows, open("/tmp/s34/busy.json", "w"))
"""])
time.sleep(1.0)
marks = []
for r in range(reps):
    t0 = time.monotonic_ns()
    ckptzip.save(second, out, mode=mode, base=key, threads=threads, resumed=True)
    marks.append((t0, time.monotonic_ns()))
    time.sleep(0.2)
open("/tmp/s34/busy.stop", "w").close(); sampler.wait(); os.remove("/tmp/s34/busy.stop")
rows = json.load(open("/tmp/s34/busy.json"))
for t0, t1 in marks:
    hist = [0.0, 0.0, 0.0]; segs = []
    for (ta, sa), (tb, sb) in zip(rows, rows[1:]):
        if ta < t0 or tb > t1: continue
        run = sum(sb.get(k, 0) - sa.get(k, sb.get(k, 0)) for k in sb) / (tb - ta)
        hist[min(2, round(run))] += (tb - ta) / 1e9
        segs.append(round(run, 1))
    # busy profile in 10 slices of the save
    n = len(segs); prof = [sum(segs[i*n//10:(i+1)*n//10]) / max(1, len(segs[i*n//10:(i+1)*n//10])) for i in range(10)]
    print(f"save {(t1-t0)/1e9:.3f} s: ~0 busy {hist[0]:.3f} s, ~1 busy {hist[1]:.3f} s, ~2 busy {hist[2]:.3f} s | by tenth: " + " ".join(f"{p:.1f}" for p in prof), flush=True)
