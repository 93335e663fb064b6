import time, traceback, torch
from common import server
import ckptzip

def attempt(label, fn):
    t = time.time()
    try:
        r = fn(); print(f"[{label}] OK {time.time()-t:.1f}s", repr(r)[:200])
    except ckptzip.Error as e:
        print(f"[{label}] ckptzip.{type(e).__name__} {time.time()-t:.1f}s: {e}")
    except BaseException as e:
        print(f"[{label}] NON-CKPTZIP {type(e).__module__}.{type(e).__name__} {time.time()-t:.1f}s: {e}")
        traceback.print_exc(limit=3)

state = {"w": torch.randn(1000), "n": 3}
with server("survey1") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    fs = s.filesystem()
    for key in ["dir with space/a b.ckz", "uni/ünïcode✓.ckz", "plus/a+b.ckz", "pct/a%20b.ckz", "hash/a#b.ckz", "q/a?b.ckz"]:
        url = f"s3://{b}/{key}"
        def rt(url=url):
            ckptzip.save(state, url, storage_options=opts)
            listed = [p for p in fs.find(b, refresh=True)]
            out = ckptzip.load(url, storage_options=opts)
            assert torch.equal(out["w"], state["w"])
            return listed
        attempt(f"save/load {key!r}", rt)
        fs.rm(b, recursive=True) if False else None
    for spelling in ["S3://", "s3a://", "s3n://", "S3A://"]:
        attempt(f"spelling {spelling}", lambda sp=spelling: ckptzip.save(state, f"{sp}{b}/sp.ckz", storage_options=opts))
    attempt("missing bucket save", lambda: ckptzip.save(state, "s3://no-such-bucket-xyz/a.ckz", storage_options=opts))
    attempt("missing bucket load", lambda: ckptzip.load("s3://no-such-bucket-xyz/a.ckz", storage_options=opts))
    attempt("missing bucket manager", lambda: ckptzip.CheckpointManager("s3://no-such-bucket-xyz/run", storage_options=opts).close())
    attempt("load missing key", lambda: ckptzip.load(f"s3://{b}/nope.ckz", storage_options=opts))
    attempt("load a prefix", lambda: ckptzip.load(f"s3://{b}/plus", storage_options=opts))
    attempt("load a bucket", lambda: ckptzip.load(f"s3://{b}", storage_options=opts))
    attempt("save to bucket root", lambda: ckptzip.save(state, f"s3://{b}", storage_options=opts))
    attempt("save to key ending /", lambda: ckptzip.save(state, f"s3://{b}/dir/", storage_options=opts))
    print(fs.find(b, refresh=True))
