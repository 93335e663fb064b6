"""Memory of the failing load of a self-referencing delta (header: base {"id": null, "path": "self.ckz"},
chain_depth 1024) as the directory path grows. The error nests one message per level (reader._in_base,
`raise ... from exc` keeps every level's exception alive), so memory grows with levels^2 * len(path).
A 2.6 KB file should fail with bounded memory; the problem is peak RSS growing into GBs."""
import os, sys, subprocess, tempfile
import common, ckptzip, torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
torch.manual_seed(0)
s0 = {"w": torch.randn(256)}
ckptzip.save(s0, f"{root}/a.ckz"); ckptzip.save({"w": s0["w"] + 0.001}, f"{root}/b.ckz", base=f"{root}/a.ckz")
h, data = common.split(open(f"{root}/b.ckz", "rb").read())
blob = common.rebuild(dict(h, base={"id": None, "path": "self.ckz"}, chain_depth=1024), data)
print("file size", len(blob), "bytes")
worst = 0
for extra in (0, 200, 400):
    d = root
    while len(d) < len(root) + extra:
        d = os.path.join(d, "x" * 99)
    os.makedirs(d, exist_ok=True)
    open(f"{d}/self.ckz", "wb").write(blob)
    prog = ("import sys, resource; sys.path.insert(0,'/work/main/src'); import ckptzip\n"
            f"try:\n    ckptzip.load({d + '/self.ckz'!r}, threads=1)\n"
            "except ckptzip.Error as e:\n    print('CKPTZIP', type(e).__name__, 'message chars', len(str(e)))\n"
            "print('peakRSS_MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024)")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CKPTZIP_MALLOC": "system"})
    out = (r.stdout + r.stderr).strip().splitlines()
    rss = int(next(l.split()[1] for l in out if l.startswith("peakRSS_MB")))
    worst = max(worst, rss)
    print(f"path length {len(d) + 9}: rc={r.returncode}", " | ".join(out[-2:]))
# the header alone can make the path long: an absolute base path padded with slashes (any directory)
d = root
loc = "/" * 600 + os.path.abspath(f"{d}/self2.ckz")
open(f"{d}/self2.ckz", "wb").write(common.rebuild(dict(h, base={"id": None, "path": loc}, chain_depth=1024), data))
prog = ("import sys, resource; sys.path.insert(0,'/work/main/src'); import ckptzip\n"
        f"try:\n    ckptzip.load({d + '/self2.ckz'!r}, threads=1)\n"
        "except ckptzip.Error as e:\n    print('CKPTZIP', type(e).__name__, 'message chars', len(str(e)))\n"
        "print('peakRSS_MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024)")
r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300,
                   env={**os.environ, "CKPTZIP_MALLOC": "system"})
out = (r.stdout + r.stderr).strip().splitlines()
rss = int(next(l.split()[1] for l in out if l.startswith("peakRSS_MB")))
worst = max(worst, rss)
print(f"short dir, header base path of {len(loc)} chars (slash-padded absolute path to itself): rc={r.returncode}", " | ".join(out[-2:]))
print("PROBLEM: memory grows with the path length" if worst > 1000 else "OK")
sys.exit(1 if worst > 1000 else 0)
