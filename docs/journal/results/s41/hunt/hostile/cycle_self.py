"""A delta whose header names ITSELF as its base (base.id null, which the reader accepts without an id check).
Expect: a clean ckptzip.Error. Problem: anything else (RecursionError, crash, hang)."""
import os, sys, subprocess, tempfile, time
import common, ckptzip, torch
d = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
torch.manual_seed(0)
s0 = {"w": torch.randn(256), "b": torch.randn(64)}
s1 = {"w": s0["w"] + 0.001, "b": s0["b"]}
ckptzip.save(s0, f"{d}/a.ckz")
ckptzip.save(s1, f"{d}/b.ckz", base=f"{d}/a.ckz")
h, data = common.split(open(f"{d}/b.ckz", "rb").read())
print("base ref as written:", h["base"], "depth", h["chain_depth"])
h["base"] = {"id": None, "path": "self.ckz"}
open(f"{d}/self.ckz", "wb").write(common.rebuild(h, data))
# two-file cycle
h2 = dict(h); h2["base"] = {"id": None, "path": "y.ckz"}
h3 = dict(h); h3["base"] = {"id": None, "path": "x.ckz"}
open(f"{d}/x.ckz", "wb").write(common.rebuild(h2, data))
open(f"{d}/y.ckz", "wb").write(common.rebuild(h3, data))
bad = 0
for name in ("self.ckz", "x.ckz"):
    for what, code in [("load", f"ckptzip.load({d + '/' + name!r}, threads=1)"),
                       ("load threads=2", f"ckptzip.load({d + '/' + name!r}, threads=2)"),
                       ("get_tensor", f"ckptzip.open({d + '/' + name!r}).get_tensor('w')"),
                       ("verify", f"ckptzip.open({d + '/' + name!r}).verify()")]:
        prog = ("import sys, resource; sys.path.insert(0,'/work/main/src'); import ckptzip\n"
                f"try:\n    {code}\n    print('LOADED')\nexcept ckptzip.Error as e:\n    print('CKPTZIP ERROR', type(e).__name__, str(e)[:300])\n"
                "print('peak RSS MB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024)")
        t = time.time()
        try:
            r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "CKPTZIP_MALLOC": "system"})
            out = (r.stdout + r.stderr).strip().splitlines()
            ok = r.returncode == 0 and any("CKPTZIP ERROR" in l for l in out)
            print(f"[{name} {what}] rc={r.returncode} {time.time()-t:.1f}s ->", " | ".join(out[-4:])[:600])
        except subprocess.TimeoutExpired:
            ok = False
            print(f"[{name} {what}] HANG > 120 s")
        bad += not ok
print("PROBLEM" if bad else "OK", bad, "entry points misbehave")
sys.exit(1 if bad else 0)
