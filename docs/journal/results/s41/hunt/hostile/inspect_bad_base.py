"""`ckptzip inspect delta.ckz` when the delta is intact but its base (beside it) is damaged or not a
.ckz: inspect reads only headers, and its chain listing has statuses for 'missing' / 'id mismatch'.
Problem: inspect fails outright (rc 1, nothing listed) and blames no link status."""
import os, subprocess, sys, tempfile
import ckptzip, torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
torch.manual_seed(0); z = {"w": torch.randn(1000)}
ckptzip.save(z, f"{root}/base.ckz"); ckptzip.save({"w": z["w"] + 1e-3}, f"{root}/delta.ckz", base=f"{root}/base.ckz")
env = {**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"}
problems = 0
blob = open(f"{root}/base.ckz", "rb").read()
for what, content in (("base truncated to 100 bytes", blob[:100]), ("base header byte flipped", blob[:40] + bytes([blob[40] ^ 1]) + blob[41:]),
                      ("base replaced by text", b"hello world\n" * 10)):
    open(f"{root}/base.ckz", "wb").write(content)
    r = subprocess.run([sys.executable, "-m", "ckptzip.cli", "inspect", f"{root}/delta.ckz"], capture_output=True, text=True, env=env)
    listed = "w" in r.stdout and "total" in r.stdout
    problems += r.returncode != 0
    print(f"[{what}] inspect rc={r.returncode}, tensors listed: {listed}; {(r.stderr.strip().splitlines() or r.stdout.strip().splitlines()[1:2] or [''])[-1][:160]}")
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
