"""Paired load A/B: one delta file (written by the tree), loaded alternately by ckptzip_a (old) and
ckptzip (tree). usage: paired_load.py OLD_PKG mode gb pairs threads"""
import sys, time, tempfile, os, shutil, statistics
old_pkg, mode, gb, pairs, threads = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
tmp = tempfile.mkdtemp(); shutil.copytree(old_pkg, os.path.join(tmp, "ckptzip_a"))
sys.path.insert(0, tmp); sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch, ckptzip_a
torch.set_num_threads(threads)
first, second, _ = lossy_speed.synthetic_states(gb)
key = os.path.join(tmp, "k.ckz"); ckptzip.save(first, key, threads=2)
out = os.path.join(tmp, "d.ckz"); ckptzip.save(second, out, mode=mode, base=key, threads=2, resumed=True)
libs = {"A": ckptzip_a, "B": ckptzip}
for v in libs: libs[v].load(out, threads=threads)
times = {"A": [], "B": []}
for p in range(pairs):
    for v in ("AB" if p % 2 == 0 else "BA"):
        t = time.perf_counter(); s = libs[v].load(out, threads=threads); times[v].append(time.perf_counter() - t); del s
d = [b - a for a, b in zip(times["A"], times["B"])]
print(f"load {mode} {gb} GB x{threads}: A median {statistics.median(times['A']):.3f} [{min(times['A']):.3f}-{max(times['A']):.3f}] B median {statistics.median(times['B']):.3f} [{min(times['B']):.3f}-{max(times['B']):.3f}] B-A median {statistics.median(d):+.3f}, B faster {sum(x<0 for x in d)}/{pairs}", flush=True)
