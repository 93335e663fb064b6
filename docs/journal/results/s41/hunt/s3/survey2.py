import time, traceback, torch
from common import server
import ckptzip

def attempt(label, fn):
    t = time.time()
    try:
        r = fn(); print(f"[{label}] OK {time.time()-t:.1f}s", repr(r)[:300])
    except ckptzip.Error as e:
        print(f"[{label}] ckptzip.{type(e).__name__} {time.time()-t:.1f}s: {e}")
    except BaseException as e:
        print(f"[{label}] NON-CKPTZIP {type(e).__module__}.{type(e).__name__} {time.time()-t:.1f}s: {e}")
        traceback.print_exc(limit=4)

def st(i):
    torch.manual_seed(0); w = torch.randn(50_000)
    return {"w": w + i * 1e-3, "i": i}

with server("survey2") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    fs = s.filesystem()
    for prefix in ["run #1", "run ü+%20", "run?x=1", "run/"]:
        url = f"s3://{b}/{prefix}"
        def go(url=url):
            with ckptzip.CheckpointManager(url, keep_last=2, async_save=False, storage_options=opts) as m:
                for i in range(1, 5):
                    m.save(i, st(i))
                steps = m.steps()
                r = m.restore()
                assert torch.equal(r["w"], st(4)["w"]), "wrong values"
            with ckptzip.CheckpointManager(url, storage_options=opts) as m2:
                steps2 = m2.steps()
                r = m2.restore(); assert torch.equal(r["w"], st(4)["w"])
            return steps, steps2, sorted(fs.find(b, refresh=True))
        attempt(f"manager {prefix!r}", go)
    # deltas with '#' names
    a, d = f"s3://{b}/h/x#1.ckz", f"s3://{b}/h/x#2.ckz"
    attempt("save base #", lambda: ckptzip.save(st(1), a, storage_options=opts))
    attempt("save delta # on base #", lambda: ckptzip.save(st(2), d, base=a, storage_options=opts))
    attempt("load delta #", lambda: torch.equal(ckptzip.load(d, storage_options=opts)["w"], st(2)["w"]))
