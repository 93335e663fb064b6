import time, traceback, torch, socket
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
        traceback.print_exc(limit=4)

sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]; sock.close()
dead = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
small = {"w": torch.randn(1000)}
attempt("refused: save", lambda: ckptzip.save(small, "s3://b/a.ckz", storage_options=dead))
attempt("refused: load", lambda: ckptzip.load("s3://b/a.ckz", storage_options=dead))
attempt("refused: manager", lambda: ckptzip.CheckpointManager("s3://b/run", storage_options=dead))
attempt("refused: exists", lambda: ckptzip.storage.exists("s3://b/a.ckz", storage_options=dead))
bad = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": "not a url"}}
attempt("bad endpoint: save", lambda: ckptzip.save(small, "s3://b/a.ckz", storage_options=bad))
attempt("bad endpoint: load", lambda: ckptzip.load("s3://b/a.ckz", storage_options=bad))
attempt("unknown option", lambda: ckptzip.load("s3://b/a.ckz", storage_options={"nonsense": 1}))
with server("survey4") as s:
    b = s.bucket()
    opts = s.storage_options(retries=1)
    ckptzip.save(small, f"s3://{b}/a.ckz", storage_options=opts)
    tiny = dict(opts, config_kwargs={"read_timeout": 0.0001, "connect_timeout": 0.0001, "retries": {"max_attempts": 1}})
    attempt("tiny timeouts: load", lambda: ckptzip.load(f"s3://{b}/a.ckz", storage_options=tiny))
    attempt("tiny timeouts: save", lambda: ckptzip.save(small, f"s3://{b}/b.ckz", storage_options=tiny))
    attempt("tiny timeouts: manager", lambda: ckptzip.CheckpointManager(f"s3://{b}/run", storage_options=tiny))
    strs = dict(opts, config_kwargs={"read_timeout": "5", "retries": {"max_attempts": "x"}})
    attempt("string config: load", lambda: ckptzip.load(f"s3://{b}/a.ckz", storage_options=strs))
