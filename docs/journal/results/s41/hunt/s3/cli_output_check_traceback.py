"""`ckptzip compress X -o s3://...` (and decompress/flatten -o URL) first asks whether the output
exists (cli._output_for -> storage.exists -> fs.exists). A store that cannot be reached or
refuses the credentials (403) makes that raise a raw botocore/PermissionError: the CLI dies with a
Python traceback instead of 'ckptzip: error: ...'. (`verify`, `inspect` on the same URL give clean
errors.)"""
import os, socket, subprocess, sys, torch
sys.path.insert(0, "/tmp/hunt41/s3")
from fake403 import start
os.makedirs("/tmp/hunt41/s3/work", exist_ok=True)
torch.save({"w": torch.randn(1000)}, "/tmp/hunt41/s3/work/s.pt")
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
srv, ep403 = start()
bad = False
for label, ep in (("nothing listening", f"http://127.0.0.1:{port}"), ("403 for every request", ep403)):
    for args in (["compress", "/tmp/hunt41/s3/work/s.pt", "-o", "s3://bucket/s.ckz"],
                 ["decompress", "/tmp/hunt41/s3/work/s.ckz", "-o", "s3://bucket/s.pt"],
                 ["verify", "s3://bucket/s.ckz"]):
        if args[0] == "decompress":
            import ckptzip; ckptzip.save({"w": torch.randn(10)}, "/tmp/hunt41/s3/work/s.ckz")
        p = subprocess.run(["/work/main/.venv/bin/ckptzip", *args, "--storage-option", f"client_kwargs.endpoint_url={ep}",
                            "--storage-option", "key=k", "--storage-option", "secret=s",
                            "--storage-option", "config_kwargs.retries.max_attempts=1"],
                           capture_output=True, text=True, timeout=300, env={**os.environ, "CKPTZIP_MALLOC": "system"})
        tb = "Traceback" in p.stderr
        bad |= tb
        print(f"[{label}] ckptzip {args[0]}: rc={p.returncode} traceback={tb}; last line: {p.stderr.strip().splitlines()[-1][:200]}")
sys.exit(1 if bad else 0)
