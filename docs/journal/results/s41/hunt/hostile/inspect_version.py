"""`ckptzip inspect` of a file whose header's "version" is not a list (readers ignore it otherwise:
load works). Problem: inspect dies with a TypeError traceback."""
import os, sys, subprocess, tempfile
import common, ckptzip, torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
h, data = common.split(ckptzip.dumps({"w": torch.randn(10)}))
problems = 0
for v in (1, 1.0, None, "1.0"):
    p = f"{root}/v.ckz"
    open(p, "wb").write(common.rebuild(dict(h, version=v), data))
    ckptzip.load(p)  # loads fine
    r = subprocess.run([sys.executable, "-m", "ckptzip.cli", "inspect", p], capture_output=True, text=True,
                       env={**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"})
    tb = "Traceback" in r.stderr; problems += tb
    print(f"version={v!r}: load OK; inspect rc={r.returncode}{' TRACEBACK ' + r.stderr.strip().splitlines()[-1] if tb else ' ' + (r.stdout.splitlines() or [''])[0][-70:]}")
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
