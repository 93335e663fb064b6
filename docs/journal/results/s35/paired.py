"""Paired A/B in one process: ckptzip_a (a copy of the old package) against ckptzip (the tree),
alternating saves of the demo delta. usage: [GB=0.25] paired.py OLD_SRC_PKG_DIR mode threads pairs (GB: the synthetic state of that size, not the demo)"""
import sys, time, tempfile, os, hashlib, importlib, shutil, statistics
old_pkg, mode, threads, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
tmp = tempfile.mkdtemp()
shutil.copytree(old_pkg, os.path.join(tmp, "ckptzip_a"))
sys.path.insert(0, tmp); sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
import ckptzip_a
assert ckptzip_a.__file__ != ckptzip.__file__
torch.set_num_threads(threads)
first, second, _ = lossy_speed.synthetic_states(float(os.environ.get("GB", "0.25"))) if os.environ.get("GB") else lossy_speed.demo_states(20, 5)
key = os.path.join(tmp, "k.ckz"); ckptzip.save(first, key, threads=2)
libs = {"A": ckptzip_a, "B": ckptzip}
outs = {v: os.path.join(tmp, f"d{v}.ckz") for v in libs}
for v, lib in libs.items():
    lib.save(second, outs[v], mode=mode, base=key, threads=threads, resumed=True)
times = {"A": [], "B": []}
for p in range(pairs):
    order = "AB" if p % 2 == 0 else "BA"
    for v in order:
        t = time.perf_counter()
        libs[v].save(second, outs[v], mode=mode, base=key, threads=threads, resumed=True)
        times[v].append(time.perf_counter() - t)
sha = {v: hashlib.sha256(open(outs[v], "rb").read()).hexdigest()[:12] for v in libs}
d = [b - a for a, b in zip(times["A"], times["B"])]
faster = sum(x < 0 for x in d)
print(f"{mode} x{threads} {pairs} pairs: A median {statistics.median(times['A']):.3f} [{min(times['A']):.3f}-{max(times['A']):.3f}]"
      f"  B median {statistics.median(times['B']):.3f} [{min(times['B']):.3f}-{max(times['B']):.3f}]"
      f"  B-A median {statistics.median(d):+.3f}, B faster in {faster}/{pairs}; sha A {sha['A']} B {sha['B']}", flush=True)
