import subprocess, sys, os, socket, torch, json
from common import server
import ckptzip
CLI = "/work/main/.venv/bin/ckptzip"
os.makedirs("/tmp/hunt41/s3/work", exist_ok=True)
torch.manual_seed(0)
w = torch.randn(100_000)
torch.save({"w": w}, "/tmp/hunt41/s3/work/a.pt")
torch.save({"w": w + 1e-3}, "/tmp/hunt41/s3/work/b.pt")

def run(label, *args):
    p = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=600, env={**os.environ, "CKPTZIP_MALLOC": "system"})
    err = p.stderr.strip()
    tb = "Traceback" in err
    print(f"[{label}] rc={p.returncode}{' TRACEBACK' if tb else ''}\n   out: {p.stdout.strip()[:400]}\n   err: {err[-600:]}")
    return p

def so(opts):
    return ["--storage-option", f"client_kwargs.endpoint_url={opts['client_kwargs']['endpoint_url']}",
            "--storage-option", "key=k", "--storage-option", "secret=s"]

sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
dead = so({"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}})
run("compress to dead endpoint", "compress", "/tmp/hunt41/s3/work/a.pt", "-o", "s3://b/a.ckz", *dead)
run("verify on dead endpoint", "verify", "s3://b/a.ckz", *dead)
with server("cli") as s:
    b = s.bucket()
    o = so(s.storage_options())
    A, B = f"s3://{b}/p/a.ckz", f"s3://{b}/p/b.ckz"
    run("compress a", "compress", "/tmp/hunt41/s3/work/a.pt", "-o", A, *o)
    run("compress b as delta on a", "compress", "/tmp/hunt41/s3/work/b.pt", "--base", A, "-o", B, *o)
    run("inspect b", "inspect", B, *o)
    run("verify b", "verify", B, *o)
    run("decompress b", "decompress", B, "-o", "/tmp/hunt41/s3/work/b_out.pt", "-f", *o)
    run("flatten b in place (a has no dependents; b in place)", "flatten", B, *o)
    run("compress b2 delta on a", "compress", "/tmp/hunt41/s3/work/b.pt", "--base", A, "-o", f"s3://{b}/p/b2.ckz", *o)
    run("flatten a in place? (keyframe)", "flatten", A, *o)
    run("decompress --rm a (b2 depends on it)", "decompress", A, "-o", "/tmp/hunt41/s3/work/a_out.pt", "--rm", "-f", *o)
    run("verify missing", "verify", f"s3://{b}/p/missing.ckz", *o)
    run("verify prefix", "verify", f"s3://{b}/p", *o)
    run("compress to missing bucket", "compress", "/tmp/hunt41/s3/work/a.pt", "-o", "s3://nobucket/a.ckz", *o)
    run("compress S3:// upper", "compress", "/tmp/hunt41/s3/work/a.pt", "-o", f"S3://{b}/up.ckz", *o)
    run("compress from s3 source (a .ckz?)", "compress", A, "-o", f"s3://{b}/p/aa.ckz", *o)
    run("decompress to s3", "decompress", A, "-o", f"s3://{b}/p/a.pt", *o)
    run("compress s3 .pt source", "compress", f"s3://{b}/p/a.pt", "-o", f"s3://{b}/p/a2.ckz", *o)
    run("compress without -o from s3", "compress", f"s3://{b}/p/a.pt", *o)
    s.read_only(b)
    run("compress to read-only", "compress", "/tmp/hunt41/s3/work/a.pt", "-o", f"s3://{b}/p/ro.ckz", *o)
    run("flatten in read-only", "flatten", f"s3://{b}/p/b2.ckz", "-f", *o)
    run("verify in read-only", "verify", f"s3://{b}/p/b2.ckz", *o)
