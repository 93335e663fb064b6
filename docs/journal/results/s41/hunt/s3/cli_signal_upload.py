"""SIGTERM / SIGINT to `ckptzip compress -o s3://...` once its multipart upload has begun:
does the CLI abort the upload (docs: a failed save's upload is aborted, its parts dropped)?"""
import os, signal, subprocess, sys, time, torch
from common import server
torch.manual_seed(0)
torch.save({"w": torch.randn(12_000_000)}, "/tmp/hunt41/s3/work/big.pt")  # 48 MB, ~6 parts
bad = False
with server("clisig") as s:
    b = s.bucket()
    ep = s.storage_options()["client_kwargs"]["endpoint_url"]
    fs = s.filesystem()
    for sig in (signal.SIGTERM, signal.SIGINT):
        key = f"out-{sig.name}.ckz"
        p = subprocess.Popen(["/work/main/.venv/bin/ckptzip", "compress", "-T", "1", "/tmp/hunt41/s3/work/big.pt", "-o", f"s3://{b}/{key}",
                              "--storage-option", f"client_kwargs.endpoint_url={ep}", "--storage-option", "key=k", "--storage-option", "secret=s"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "CKPTZIP_MALLOC": "system"})
        while p.poll() is None:
            ups = fs.call_s3("list_multipart_uploads", Bucket=b).get("Uploads") or []
            if any(u["Key"] == key for u in ups):
                break
            time.sleep(0.05)
        p.send_signal(sig)
        out, err = p.communicate(timeout=300)
        ups = [u["Key"] for u in fs.call_s3("list_multipart_uploads", Bucket=b).get("Uploads") or []]
        objs = fs.ls(b, refresh=True)
        print(f"{sig.name}: rc={p.returncode} stderr={err.strip()[-300:]!r}\n   unfinished uploads: {ups}; objects: {objs}")
        if key in ups or "Traceback" in err:
            bad = True
sys.exit(1 if bad else 0)
