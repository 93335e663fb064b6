import time, traceback, torch
from common import server
import ckptzip
from ckptzip import objstore

def attempt(label, fn):
    t = time.time()
    try:
        r = fn(); print(f"[{label}] OK {time.time()-t:.1f}s", repr(r)[:300])
    except ckptzip.Error as e:
        print(f"[{label}] ckptzip.{type(e).__name__} {time.time()-t:.1f}s: {e}")
    except BaseException as e:
        print(f"[{label}] NON-CKPTZIP {type(e).__module__}.{type(e).__name__} {time.time()-t:.1f}s: {str(e)[-600:]}")
        traceback.print_exc(limit=-4)

def st(seed, n=3_000_000):
    torch.manual_seed(seed)
    return {"a": torch.randn(n), "b": torch.randn(n // 3), "c": torch.arange(1000.0)}

with server("read") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    fs = s.filesystem()
    A = f"s3://{b}/a.ckz"
    ckptzip.save(st(1), A, storage_options=opts)
    data = fs.cat(f"{b}/a.ckz")
    print("object size", len(data))
    for cut in (10, 100, len(data) // 2, len(data) - 1):
        fs.pipe(f"{b}/t.ckz", data[:cut])
        attempt(f"truncated at {cut}", lambda: ckptzip.load(f"s3://{b}/t.ckz", storage_options=opts))
    # replaced mid-read
    orig = objstore.ObjectStore.fetch
    for after in (1, 2, 4):
        ckptzip.save(st(1), A, storage_options=opts)
        calls = [0]
        def fetch(self, path, start, end, after=after):
            calls[0] += 1
            if calls[0] == after + 1:
                ckptzip.save(st(2), A, storage_options=opts)  # another writer replaces it
            return orig(self, path, start, end)
        objstore.ObjectStore.fetch = fetch
        def go():
            out = ckptzip.load(A, storage_options=opts, threads=2)
            e1, e2 = st(1), st(2)
            return {k: ("v1" if torch.equal(out[k], e1[k]) else "v2" if torch.equal(out[k], e2[k]) else "MIXED/OTHER") for k in out}
        attempt(f"replaced after {after} fetches", go)
        objstore.ObjectStore.fetch = orig
    # replaced by a shorter object mid read
    ckptzip.save(st(1), A, storage_options=opts)
    calls = [0]
    def fetch2(self, path, start, end):
        calls[0] += 1
        if calls[0] == 2:
            ckptzip.save(st(2, 1000), A, storage_options=opts)
        return orig(self, path, start, end)
    objstore.ObjectStore.fetch = fetch2
    attempt("replaced by a smaller object mid-read", lambda: ckptzip.load(A, storage_options=opts))
    objstore.ObjectStore.fetch = orig
    # deleted mid read
    calls = [0]
    def fetch3(self, path, start, end):
        calls[0] += 1
        if calls[0] == 2:
            fs.rm(path)
        return orig(self, path, start, end)
    objstore.ObjectStore.fetch = fetch3
    attempt("deleted mid-read", lambda: ckptzip.load(A, storage_options=opts))
    objstore.ObjectStore.fetch = orig
    # delta chains
    X, D = f"s3://{b}/ch/x.ckz", f"s3://{b}/ch/d.ckz"
    s1 = st(1); s2 = {k: v.clone() for k, v in s1.items()}; s2["c"] += 1
    ckptzip.save(s1, X, storage_options=opts)
    ckptzip.save(s2, D, base=X, storage_options=opts)
    attempt("delta loads", lambda: torch.equal(ckptzip.load(D, storage_options=opts)["c"], s2["c"]))
    ckptzip.save(st(5), X, storage_options=opts)
    attempt("base overwritten", lambda: ckptzip.load(D, storage_options=opts))
    fs.rm(f"{b}/ch/x.ckz")
    attempt("base deleted", lambda: ckptzip.load(D, storage_options=opts))
    attempt("base deleted: open+get c", lambda: ckptzip.open(D, storage_options=opts).get_tensor("c"))
