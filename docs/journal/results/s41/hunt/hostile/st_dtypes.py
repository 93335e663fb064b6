"""Not hostile: torch.save files holding a tensor of a dtype safetensors has no code for (complex128,
float8_e4m3fnuz / float8_e5m2fnuz as AMD's fp8 training uses, bits16, complex32), compressed, then
`ckptzip -d --to safetensors`. Expect 'ckptzip: error: ... cannot be stored in safetensors; use --to pt'.
Problem: a KeyError traceback out of sources.write_safetensors (safetensors' _TYPES lookup)."""
import os, subprocess, sys, tempfile, warnings
warnings.filterwarnings("ignore")
import torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
env = {**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"}
cli = [sys.executable, "-W", "ignore", "-m", "ckptzip.cli"]
problems = 0
for name, t in [("complex128", torch.randn(4, dtype=torch.complex128)),
                ("float8_e4m3fnuz", torch.randn(4).to(torch.float8_e4m3fnuz)),
                ("float8_e5m2fnuz", torch.randn(4).to(torch.float8_e5m2fnuz)),
                ("complex32", torch.randn(4, dtype=torch.complex64).to(torch.complex32)),
                ("bits16", torch.zeros(4, dtype=torch.int16).view(torch.bits16))]:
    src = f"{root}/{name}.pt"
    try:
        torch.save({"w": torch.randn(4), "x": t}, src)
    except Exception as e:
        print(f"{name}: torch.save itself fails ({type(e).__name__}); skipped"); continue
    c = subprocess.run(cli + ["compress", "-q", src], capture_output=True, text=True, env=env)
    if c.returncode:
        print(f"{name}: compress rc={c.returncode}: {c.stderr.strip().splitlines()[-1][:120]}"); continue
    r = subprocess.run(cli + ["-d", "-q", "--to", "safetensors", src + ".ckz"], capture_output=True, text=True, env=env)
    tb = "Traceback" in r.stderr; problems += tb
    print(f"{name}: -d --to safetensors rc={r.returncode}{' TRACEBACK' if tb else ''}: {(r.stderr.strip().splitlines() or [''])[-1][:130]}")
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
