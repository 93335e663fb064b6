"""Peak memory of loading the newest file of a delta chain, by chain depth: a 16 MB state
(one fp32 tensor of 4M elements, 100,000 random elements changed by 0.01 a step), saved as
ckptzip.save(..., base=previous) with each library, loaded in a fresh process with threads=1;
VmHWM above the process's VmRSS before the load (not ru_maxrss: a child's keeps the parent's).
usage: chain_memory.py SRC_DIR [SRC_DIR ...]   (each a checkout's src/, the library to measure)"""
import os, subprocess, sys, tempfile

BUILD = r"""
import sys, torch, ckptzip
out = sys.argv[1]
generator = torch.Generator().manual_seed(0)
weight = torch.randn(4_000_000, generator=generator)
previous = None
for step in range(32):
    weight[torch.randint(0, weight.numel(), (100_000,), generator=generator)] += 0.01
    path = f"{out}/{step}.ckz"
    ckptzip.save({"w": weight}, path, base=previous, keyframe_every=None)
    previous = path
"""
PROBE = r"""
import sys, ckptzip
def kb(key):
    return int(next(l for l in open('/proc/self/status') if l.startswith(key)).split()[1]) * 1024
before = kb('VmRSS')
ckptzip.load(sys.argv[1], threads=1)
print(kb('VmHWM') - before)
"""
for src in sys.argv[1:]:
    env = dict(os.environ, PYTHONPATH=src, CKPTZIP_MALLOC="system")
    with tempfile.TemporaryDirectory() as out:
        subprocess.run([sys.executable, "-c", BUILD, out], env=env, check=True)
        for step in (0, 1, 3, 7, 15, 31):
            path = f"{out}/{step}.ckz"
            peak = int(subprocess.run([sys.executable, "-c", PROBE, path], env=env, check=True,
                                      capture_output=True, text=True).stdout)
            depth = subprocess.run([sys.executable, "-c", "import sys, ckptzip; "
                                    "print(ckptzip.open(sys.argv[1]).chain_depth)", path], env=env,
                                   check=True, capture_output=True, text=True).stdout.strip()
            print(f"{src}: depth {depth:>2}: peak above start {peak / 2**20:6.1f} MiB = "
                  f"{peak / (16 * 2**20):4.1f}x the 16 MiB state", flush=True)
