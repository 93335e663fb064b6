"""Not hostile at all: a torch.save checkpoint with tied weights (lm_head.weight is wte.weight, as
GPT-2 state dicts have), compressed, then `ckptzip -d --to safetensors`. Expect a restored file or a
clean 'ckptzip: error:'. Problem: a Python traceback (safetensors' RuntimeError on shared memory)."""
import os, subprocess, sys, tempfile
import torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
w = torch.randn(16, 8)
torch.save({"wte.weight": w, "lm_head.weight": w}, f"{root}/tied.pt")
env = {**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"}
cli = [sys.executable, "-m", "ckptzip.cli"]
subprocess.run(cli + ["compress", "-q", f"{root}/tied.pt"], check=True, env=env)
r = subprocess.run(cli + ["-d", "-q", "--to", "safetensors", f"{root}/tied.pt.ckz"], capture_output=True, text=True, env=env)
print("rc", r.returncode); print("\n".join(r.stderr.strip().splitlines()[-4:]))
bad = "Traceback" in r.stderr
print("PROBLEM: traceback" if bad else "OK")
sys.exit(1 if bad else 0)
