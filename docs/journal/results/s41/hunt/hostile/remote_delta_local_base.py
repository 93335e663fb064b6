"""A delta read from an object store URL (fsspec's memory:// here, standing in for s3://) whose
header names an ABSOLUTE LOCAL path as its base, with "id": null. FORMAT.md: "The header is untrusted:
a path that is a URL is followed only when the delta was itself read from a URL of the same scheme
and host" -- i.e. a file decides only within its own origin. Problem: the remote file makes the load
open a file on the loading machine's disk and decode against it (the decoded state mixes in the local
file's tensors), and error messages quote local files' first bytes."""
import os, sys, tempfile
import common, ckptzip, torch, fsspec
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
secret = {"w": torch.full((4096,), 42.0)}            # a checkpoint that exists only on the local disk
ckptzip.save(secret, f"{root}/private.ckz")
torch.manual_seed(0)
z = {"w": torch.randn(4096)}
ckptzip.save(z, f"{root}/z.ckz")
ckptzip.save({"w": z["w"] + 1e-4}, f"{root}/d.ckz", base=f"{root}/z.ckz")   # a real delta leaf
h, data = common.split(open(f"{root}/d.ckz", "rb").read())
fs = fsspec.filesystem("memory")
problems = 0
for target in (f"{root}/private.ckz", "/etc/hostname"):
    hh = dict(h, base={"id": None, "path": target})
    fs.pipe("/bucket/evil.ckz", common.rebuild(hh, data))
    try:
        out = ckptzip.load("memory://bucket/evil.ckz", threads=1)
        print(f"base {target}: LOADED against the local file; w[:4] =", out["w"][:4].tolist())
        problems += 1
    except ckptzip.BaseMismatchError as e:
        m = str(e); print(f"base {target}: BaseMismatchError: {m[:220]}")
        problems += "remote base" not in m and "only from where" not in m
    except ckptzip.Error as e:
        print(f"base {target}: {type(e).__name__}: {str(e)[:300]}")
        problems += 1
assert h["leaves"][0].get("base"), "the seed must be a real delta leaf"
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
