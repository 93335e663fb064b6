"""A lossy delta's load in a fresh process (its first touch of the memory it decodes into),
two libraries taking turns: the old tree's and this one's. usage: GB=1 first_load.py OLD_SRC
mode rounds [threads] (OLD_SRC: the src folder of a worktree with its built extension)"""
import os, subprocess, sys, tempfile, shutil, statistics
old_src, mode, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 1
sys.path.insert(0, "/work/main/benchmarks")
import lossy_speed, ckptzip, torch
tmp = tempfile.mkdtemp()
CHILD = """
import sys, time, torch
sys.path.insert(0, {src!r})
import ckptzip
torch.set_num_threads({threads})
t = time.perf_counter(); s = ckptzip.load({path!r}, threads={threads}); el = time.perf_counter() - t
import hashlib
h = hashlib.sha256()
for k in sorted(s["model"]): h.update(s["model"][k].numpy().tobytes())
print(f"{{el:.3f}} {{h.hexdigest()[:12]}}")
"""
try:
    first, second, params = lossy_speed.synthetic_states(float(os.environ.get("GB", "1")))
    key = os.path.join(tmp, "k.ckz"); ckptzip.save(first, key, threads=2)
    out = os.path.join(tmp, "d.ckz")
    ckptzip.save(second, out, mode=mode, base=key, threads=2, resumed=True)
    del first, second
    raw = params * 12
    srcs = {"old": old_src, "new": "/work/main/src"}
    times = {"old": [], "new": []}
    for r in range(rounds):
        for v in (("old", "new") if r % 2 == 0 else ("new", "old")):
            run = subprocess.run([sys.executable, "-c", CHILD.format(src=srcs[v], path=out, threads=threads)],
                                 capture_output=True, text=True, env=dict(os.environ, CKPTZIP_MALLOC="system"))
            assert run.returncode == 0, run.stderr
            el, digest = run.stdout.split()
            times[v].append(float(el))
            print(r, v, el, digest, f"{raw / float(el) / 1e6:.0f} MB/s", flush=True)
    for v in times:
        print(v, "median", f"{statistics.median(times[v]):.3f} s", f"{raw / statistics.median(times[v]) / 1e6:.0f} MB/s",
              "range", f"{raw / max(times[v]) / 1e6:.0f}-{raw / min(times[v]) / 1e6:.0f} MB/s")
finally:
    shutil.rmtree(tmp)
