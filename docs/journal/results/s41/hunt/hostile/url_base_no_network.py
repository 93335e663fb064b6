"""A local delta whose header names a remote base (s3://, http://, fsspec chains, odd casing).
Expect BaseMismatchError without any network activity (socket connect / DNS lookups are trapped).
Also inspect (chain_of) and verify via the CLI in-process."""
import contextlib, io, socket, sys, tempfile
import common, ckptzip, torch
from ckptzip.cli import main
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
torch.manual_seed(0)
z = {"w": torch.randn(4096)}
ckptzip.save(z, f"{root}/z.ckz"); ckptzip.save({"w": z["w"] + 1e-4}, f"{root}/d.ckz", base=f"{root}/z.ckz")
h, data = common.split(open(f"{root}/d.ckz", "rb").read())
net = []
def trap(name):
    def f(*a, **k):
        net.append((name, a[:2])); raise OSError("network trapped")
    return f
socket.getaddrinfo = trap("getaddrinfo"); socket.create_connection = trap("create_connection")
socket.socket.connect = trap("connect"); socket.socket.connect_ex = trap("connect_ex")
problems = 0
for loc in ["s3://bucket/z.ckz", "S3://bucket/z.ckz", "http://127.0.0.1:9/z.ckz", "https://example.com/z.ckz",
            "simplecache::s3://bucket/z.ckz", "gs://b/z.ckz", "s3a://bucket/z.ckz", "hf://x/y/z.ckz",
            "ftp://example.com/z.ckz", "s3:/bucket/z.ckz", "github://o:r@main/z.ckz"]:
    p = f"{root}/evil.ckz"
    open(p, "wb").write(common.rebuild(dict(h, base={"id": h["base"]["id"], "path": loc}), data))
    res = []
    for what, fn in [("load", lambda: ckptzip.load(p, threads=1)), ("get_tensor", lambda: ckptzip.open(p).get_tensor("w"))]:
        before = len(net)
        try:
            fn(); res.append(f"{what}: LOADED")
        except ckptzip.Error as e:
            res.append(f"{what}: {type(e).__name__}")
        except Exception as e:
            res.append(f"{what}: NON-CKPTZIP {type(e).__name__}: {e}"); problems += 1
        if len(net) > before:
            res.append(f"NETWORK {net[before:]}"); problems += 1
    for args in (["inspect", p], ["verify", p]):
        before = len(net)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                rc = main(args)
            except Exception as e:
                rc = f"EXC {type(e).__name__}"; problems += 1
        res.append(f"cli {args[0]} rc={rc}")
        if len(net) > before:
            res.append(f"NETWORK {net[before:]}"); problems += 1
    print(f"{loc!r}: " + "; ".join(res))
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
