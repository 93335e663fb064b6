"""Every single-byte flip and every truncation of a directory archive (.ckz of a folder with a
safetensors file, a torch file, JSON, a subfolder, an empty folder), restored with `ckptzip -d`
in-process: each must be 'ckptzip: error:' (rc 1, no exception out of main) or restore the original
folder byte for byte; nothing may be left beside the output."""
import contextlib, filecmp, io, os, shutil, sys, tempfile
import common
from ckptzip.cli import main
S = "/tmp/hunt41/hostile/seeds"
orig = open(f"{S}/dir.ckz", "rb").read()
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
def tree_of(d):
    out = {}
    for rt, ds, fs in os.walk(d):
        for x in ds: out[os.path.relpath(os.path.join(rt, x), d) + "/"] = None
        for x in fs: out[os.path.relpath(os.path.join(rt, x), d)] = open(os.path.join(rt, x), "rb").read()
    return out
main(["-d", "-q", "-o", f"{root}/ref", f"{S}/dir.ckz"])
ref = tree_of(f"{root}/ref")
src = tree_of(f"{S}/srcdir")
print("reference restore equals the source folder except torch files:", {k for k in src if src[k] != ref.get(k)})
bad = []; errors = exact = 0
variants = [(f"flip {i}", orig[:i] + bytes([orig[i] ^ (1 << (i % 8))]) + orig[i + 1:]) for i in range(len(orig))]
variants += [(f"cut {i}", orig[:i]) for i in range(len(orig))]
for what, blob in variants:
    open(f"{root}/in.ckz", "wb").write(blob)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["-d", "-q", "-o", f"{root}/out", f"{root}/in.ckz"])
    except BaseException as e:
        bad.append(f"{what}: exception {type(e).__name__}: {e}"); rc = None
    if rc == 0:
        got = tree_of(f"{root}/out")
        if got != ref: bad.append(f"{what}: restored a different folder")
        else: exact += 1
    elif rc == 1: errors += 1
    if os.path.exists(f"{root}/out"): shutil.rmtree(f"{root}/out")
    left = set(os.listdir(root)) - {"in.ckz", "ref"}
    if left: bad.append(f"{what}: left behind {left}"); [shutil.rmtree(os.path.join(root, x), ignore_errors=True) for x in left]
print(f"variants {len(variants)}: errors {errors}, exact {exact}, problems {len(bad)}")
print("\n".join(bad[:10])); sys.exit(1 if bad else 0)
