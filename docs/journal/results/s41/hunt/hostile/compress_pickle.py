"""`ckptzip compress` / `bench` of hostile torch.save inputs (.pt, .bin, .ckpt, .pth, a directory holding
one, a .safetensors that is really a pickle): the pickle's __reduce__ would create a marker file.
Expect: never created; clean errors (or bytes kept, inside a directory)."""
import os, subprocess, sys, tempfile, torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
marker = f"{root}/EXECUTED"
class Marker:
    def __reduce__(self):
        return (open, (marker, "w"))
env = {**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"}
cli = [sys.executable, "-m", "ckptzip.cli"]
problems = 0
os.makedirs(f"{root}/dir"); open(f"{root}/dir/config.json", "w").write("{}")
for name in ("x.pt", "x.bin", "x.ckpt", "x.pth", "dir/training_args.bin", "x.safetensors", "X.PT"):
    torch.save({"w": torch.ones(2), "evil": Marker()}, f"{root}/{name}")
for src in ("x.pt", "x.bin", "x.ckpt", "x.pth", "dir", "x.safetensors", "X.PT"):
    for cmd in (["compress", "-f", "-q"], ["bench", "--repeat", "1"]):
        if cmd[0] == "bench" and src != "x.pt": continue
        r = subprocess.run(cli + cmd + [f"{root}/{src}"], capture_output=True, text=True, env=env, timeout=300)
        tb = "Traceback" in r.stderr
        ex = os.path.exists(marker)
        problems += tb or ex
        print(f"{cmd[0]} {src}: rc={r.returncode}{' TRACEBACK' if tb else ''}{' EXECUTED' if ex else ''}: {(r.stderr.strip().splitlines() or [''])[-1][:150]}")
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
