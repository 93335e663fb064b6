import os, time, traceback, warnings, torch
warnings.filterwarnings("ignore")
from common import server
import ckptzip
import torch.distributed.checkpoint as dcp
from ckptzip.dcp import CompressedWriter, CompressedReader
os.makedirs("/tmp/hunt41/s3/dcpcwd", exist_ok=True); os.chdir("/tmp/hunt41/s3/dcpcwd")

def attempt(label, fn):
    t = time.time()
    try:
        r = fn(); print(f"[{label}] OK {time.time()-t:.1f}s", repr(r)[:300])
    except ckptzip.Error as e:
        print(f"[{label}] ckptzip.{type(e).__name__} {time.time()-t:.1f}s: {e}")
    except BaseException as e:
        print(f"[{label}] NON-CKPTZIP {type(e).__module__}.{type(e).__name__} {time.time()-t:.1f}s: {str(e)[-600:]}")

def st(i):
    torch.manual_seed(0); w = torch.randn(300_000)
    return {"model": {"w": w + i * 1e-3, "b": torch.arange(5.0) * i}, "step": i}

with server("dcp") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    fs = s.filesystem()
    p1, p2 = f"s3://{b}/dcp/step-1", f"s3://{b}/dcp/step-2"
    attempt("save 1", lambda: dcp.save(st(1), storage_writer=CompressedWriter(p1, storage_options=opts)))
    print(sorted(fs.find(b, refresh=True)))
    def ld(p, i):
        t = {"model": {"w": torch.zeros(300_000), "b": torch.zeros(5)}, "step": 0}
        dcp.load(t, storage_reader=CompressedReader(p, storage_options=opts))
        return torch.equal(t["model"]["w"], st(i)["model"]["w"]), t["step"]
    attempt("load 1", lambda: ld(p1, 1))
    attempt("save 2 delta", lambda: dcp.save(st(2), storage_writer=CompressedWriter(p2, base=p1, storage_options=opts)))
    print(sorted(fs.find(b, refresh=True)))
    attempt("load 2", lambda: ld(p2, 2))
    attempt("save 2 over itself with base 2", lambda: dcp.save(st(3), storage_writer=CompressedWriter(p2, base=p2 + "/", storage_options=opts)))
    attempt("save into base's dir spelled s3a", lambda: dcp.save(st(3), storage_writer=CompressedWriter(p1.replace("s3://", "s3a://"), base=p1, storage_options=opts)))
    attempt("load 2 after", lambda: ld(p2, 2))
    attempt("load 1 after", lambda: ld(p1, 1))
    print("local files in cwd:", os.listdir("."))
