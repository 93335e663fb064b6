import os, subprocess, time, traceback, torch
os.environ["CKPTZIP_MALLOC"] = "system"
import ckptzip
from fake403 import start
srv, ep = start()
opts = {"key": "wrong", "secret": "wrong", "client_kwargs": {"endpoint_url": ep}, "config_kwargs": {"retries": {"max_attempts": 1}}}
def attempt(label, fn):
    t = time.time()
    try:
        r = fn(); print(f"[{label}] OK {time.time()-t:.1f}s", repr(r)[:200])
    except ckptzip.Error as e:
        print(f"[{label}] ckptzip.{type(e).__name__} {time.time()-t:.1f}s: {e}")
    except BaseException as e:
        print(f"[{label}] NON-CKPTZIP {type(e).__module__}.{type(e).__name__} {time.time()-t:.1f}s: {e}")
        traceback.print_exc(limit=-3)
small = {"w": torch.randn(1000)}
attempt("save", lambda: ckptzip.save(small, "s3://b/a.ckz", storage_options=opts))
attempt("save big", lambda: ckptzip.save({"w": torch.randn(5_000_000)}, "s3://b/big.ckz", storage_options=opts))
attempt("load", lambda: ckptzip.load("s3://b/a.ckz", storage_options=opts))
attempt("open", lambda: ckptzip.open("s3://b/a.ckz", storage_options=opts))
attempt("manager", lambda: ckptzip.CheckpointManager("s3://b/run", storage_options=opts))
attempt("save delta with s3 base", lambda: ckptzip.save(small, "/tmp/hunt41/s3/work/d.ckz", base="s3://b/a.ckz", storage_options=opts))
import torch.distributed.checkpoint as dcp
from ckptzip.dcp import CompressedWriter, CompressedReader
attempt("dcp save", lambda: dcp.save({"w": torch.randn(100)}, storage_writer=CompressedWriter("s3://b/dcp", storage_options=opts)))
attempt("dcp load", lambda: dcp.load({"w": torch.randn(100)}, storage_reader=CompressedReader("s3://b/dcp", storage_options=opts)))
so = ["--storage-option", f"client_kwargs.endpoint_url={ep}", "--storage-option", "key=k", "--storage-option", "secret=s", "--storage-option", "config_kwargs.retries.max_attempts=1"]
torch.save(small, "/tmp/hunt41/s3/work/s.pt")
for args in (["compress", "/tmp/hunt41/s3/work/s.pt", "-o", "s3://b/a.ckz"], ["verify", "s3://b/a.ckz"], ["inspect", "s3://b/a.ckz"], ["decompress", "s3://b/a.ckz", "-o", "/tmp/hunt41/s3/work/x.pt", "-f"], ["flatten", "s3://b/a.ckz"]):
    p = subprocess.run(["/work/main/.venv/bin/ckptzip", *args, *so], capture_output=True, text=True, timeout=300)
    print(f"[cli {args[0]}] rc={p.returncode}{' TRACEBACK' if 'Traceback' in p.stderr else ''}: {p.stderr.strip().splitlines()[-1][:300] if p.stderr.strip() else ''}")
