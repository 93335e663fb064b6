import time, traceback, torch, logging
from common import server
import ckptzip

def attempt(label, fn):
    t = time.time()
    try:
        r = fn(); print(f"[{label}] OK {time.time()-t:.1f}s", repr(r)[:300])
    except ckptzip.Error as e:
        print(f"[{label}] ckptzip.{type(e).__name__} {time.time()-t:.1f}s: {e}")
    except BaseException as e:
        print(f"[{label}] NON-CKPTZIP {type(e).__module__}.{type(e).__name__} {time.time()-t:.1f}s: {str(e)[-600:]}")
        traceback.print_exc(limit=-4)

def st(i):
    torch.manual_seed(0); w = torch.randn(100_000)
    return {"w": w + i * 1e-3}

with server("rolease") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    fs = s.filesystem()
    P = f"s3://{b}/run"
    m = ckptzip.CheckpointManager(P, async_save=True, keep_last=1, lease_seconds=3, storage_options=opts)
    m.save(1, st(1)); m.wait()
    s.read_only(b)
    attempt("save while read-only (async)", lambda: (m.save(2, st(2)), m.wait()))
    time.sleep(4)
    attempt("save after lease ran out, read-only", lambda: (m.save(3, st(3)), m.wait()))
    s.read_only(b, False)
    attempt("save after bucket writable again", lambda: (m.save(4, st(4)), m.wait()))
    attempt("steps", lambda: m.steps())
    attempt("restore", lambda: torch.equal(m.restore()["w"], st(1)["w"]))
    attempt("close", lambda: m.close())
    print("objects:", fs.ls(f"{b}/run", refresh=True))
    attempt("new manager", lambda: ckptzip.CheckpointManager(P, storage_options=opts).close())
