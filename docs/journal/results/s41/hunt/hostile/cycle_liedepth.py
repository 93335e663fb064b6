"""Self-referencing delta (base.id null, base.path = its own file name) whose header claims a
large chain_depth. reader._room_for_chain raises Python's recursion limit to
1000 + 8*min(depth,1024) = 9192, so the cycle (no cycle detection) recurses until that limit.
Expect a clean ckptzip.Error; the problem is any other exit (segfault, RecursionError), an
exhaustion of file descriptors, or a misleading message."""
import os, sys, subprocess, tempfile, time
import common, ckptzip, torch
d = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
torch.manual_seed(0)
s0 = {"w": torch.randn(256)}
ckptzip.save(s0, f"{d}/a.ckz"); ckptzip.save({"w": s0["w"] + 0.001}, f"{d}/b.ckz", base=f"{d}/a.ckz")
h, data = common.split(open(f"{d}/b.ckz", "rb").read())
bad = 0
for depth in (1, 100, 1024, 2**31):
    hh = dict(h, base={"id": None, "path": "self.ckz"}, chain_depth=depth)
    open(f"{d}/self.ckz", "wb").write(common.rebuild(hh, data))
    for threads in (1, 2):
        prog = ("import sys, resource; sys.path.insert(0,'/work/main/src'); import ckptzip\n"
                f"try:\n    ckptzip.load({d + '/self.ckz'!r}, threads={threads})\n    print('LOADED')\n"
                "except ckptzip.Error as e:\n    s=str(e); print('CKPTZIP', type(e).__name__, 'len', len(s), 'nested', s.count('cannot be read'), '...', s[-110:])\n"
                "print('peakRSS_MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024)")
        t = time.time()
        try:
            r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "CKPTZIP_MALLOC": "system"})
            out = (r.stdout + r.stderr).strip().splitlines()
            ok = r.returncode == 0 and any(l.startswith("CKPTZIP") for l in out) and not any("valid JSON" in l for l in out)
            print(f"chain_depth={depth} threads={threads}: rc={r.returncode} {time.time()-t:.1f}s", " | ".join(out[-3:])[:400])
        except subprocess.TimeoutExpired:
            ok = False; print(f"chain_depth={depth} threads={threads}: HANG")
        bad += not ok
print("PROBLEM: a self-referencing base is not detected as a cycle" if bad else "OK")
sys.exit(1 if bad else 0)
