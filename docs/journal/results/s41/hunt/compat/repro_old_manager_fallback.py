"""Reverse compatibility, manager: the CURRENT ckptzip's CheckpointManager writes adaptive steps
0, 10, 20 into a directory; ckptzip at 135c9a6 (2026-11-26; no `sqrt-scale` codec) opens the same
directory. Its restore() does not refuse: it silently returns step 0 (nothing on stderr under
default logging), and the training script's next save(20) replaces the good step-20 file the
newer version wrote.  Run with the current python and no PYTHONPATH; it runs the old version in
a subprocess.  Exit 1 when the old manager restores an older step without raising."""
import os, shutil, subprocess, sys, torch, ckptzip
here = os.path.dirname(os.path.abspath(__file__)); d = os.path.join(here, "work", "repro-mgr-fallback")
shutil.rmtree(d, ignore_errors=True)
S = torch.load(os.path.join(here, "work", "states.pt"), weights_only=False)
with ckptzip.CheckpointManager(d, mode="adaptive", keyframe_every=3, threads=1) as m:
    for i in range(3): m.save(10 * i, S[i])
size20 = os.path.getsize(f"{d}/step-00000020.ckz"); id20 = ckptzip.open(f"{d}/step-00000020.ckz").id
print("current version wrote", sorted(f for f in os.listdir(d) if f.endswith(".ckz")), "step 20 id", id20)
old = r'''
import sys, torch, ckptzip
S = torch.load(sys.argv[2], weights_only=False)
print("old reader:", ckptzip.__file__)
with ckptzip.CheckpointManager(sys.argv[1], mode="adaptive", keyframe_every=3, threads=1) as m:
    print("old steps():", m.steps())
    st = m.restore()
    print("old restore() returned state of step", st["step"] * 10, "(newest on disk: 20)")
    m.save(20, S[2])     # the script resumes from what restore() gave and saves step 20 again
'''
env = dict(os.environ, PYTHONPATH=os.path.join(here, "v-135c9a6", "src"), CKPTZIP_MALLOC="system")
r = subprocess.run([sys.executable, "-c", old, d, os.path.join(here, "work", "states.pt")], env=env, capture_output=True, text=True)
print(r.stdout, r.stderr[-800:])
with ckptzip.open(f"{d}/step-00000020.ckz") as c: now = c.id
print("step 20 id now", now, "(replaced)" if now != id20 else "(kept)")
sys.exit(1 if "returned state of step 20" not in r.stdout else 0)
