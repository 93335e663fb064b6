"""Alternating 1- and 2-thread saves of one state; prints the 2/1 speedup of each round.
usage: [GB=x] scale.py mode rounds"""
import sys, os, time, tempfile, shutil, statistics
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
mode, rounds = sys.argv[1], int(sys.argv[2])
if os.environ.get("SWI"): sys.setswitchinterval(float(os.environ["SWI"]))
gb = os.environ.get("GB")
first, second, _ = lossy_speed.synthetic_states(float(gb)) if gb else lossy_speed.demo_states(20, 5)
d = tempfile.mkdtemp(); key = os.path.join(d, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(d, "x.ckz")
for t in (1, 2): ckptzip.save(second, out, mode=mode, base=key, threads=t, resumed=True)
ratios = []
for r in range(rounds):
    times = {}
    for t in ((1, 2) if r % 2 == 0 else (2, 1)):
        s = time.perf_counter(); ckptzip.save(second, out, mode=mode, base=key, threads=t, resumed=True)
        times[t] = time.perf_counter() - s
    ratios.append(times[1] / times[2])
    print(f"round {r}: 1t {times[1]:.3f} s  2t {times[2]:.3f} s  x{ratios[-1]:.2f}", flush=True)
print(f"{mode}: median x{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]")
shutil.rmtree(d)
