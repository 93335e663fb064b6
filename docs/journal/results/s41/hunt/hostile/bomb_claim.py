"""A ~20 KB file whose header claims 100 GB (one leaf) or 20 x 16 GB (many leaves) of tensors with
1-byte bogus chunks: load/get_tensor/verify must fail with a ckptzip.Error, quickly, with small peak RSS."""
import os, subprocess, sys, tempfile, json
import common, ckptzip, torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
h0, data0 = common.split(ckptzip.dumps({"w": torch.randn(4)}))
CH = 64 << 20
def leaf(nbytes, offset):
    n = -(-nbytes // CH)
    return {"dtype": "float32", "shape": [nbytes // 4], "pipeline": 0, "offset": offset, "chunk": CH,
            "chunks": [[1, 0, 0]] * n}, n
problems = 0
for name, sizes in (("one 100 GB leaf", [100 << 30]), ("twenty 16 GB leaves", [16 << 30] * 20)):
    leaves, off, tree = [], 0, {}
    for i, s in enumerate(sizes):
        l, n = leaf(s, off); leaves.append(l); off += n; tree[f"t{i}"] = {"t": "tensor", "i": i}
    h = dict(h0, leaves=leaves, tree={"t": "dict", "o": tree}, data_length=off)
    blob = common.rebuild(h, b"\x00" * off)
    p = f"{root}/bomb.ckz"; open(p, "wb").write(blob)
    for what in ("ckptzip.load(p, threads=2)", "ckptzip.open(p).get_tensor('t0')", "ckptzip.open(p).verify()"):
        prog = ("import sys, time, resource; sys.path.insert(0,'/work/main/src'); import ckptzip\n"
                f"p = {p!r}; t = time.time()\n"
                f"try:\n    {what}; print('LOADED')\n"
                "except ckptzip.Error as e:\n    print('ckptzip', type(e).__name__, str(e)[:90])\n"
                "print('RESULT', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024, round(time.time()-t, 2))")
        r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "CKPTZIP_MALLOC": "system"})
        out = r.stdout.splitlines()
        res = [l for l in out if l.startswith("RESULT")]
        rss = int(res[0].split()[1]) if res else -1
        bad = r.returncode != 0 or not any(l.startswith("ckptzip") for l in out) or rss > 600
        problems += bad
        print(f"[{name}, file {len(blob):,} B] {what}: {out[0][:120] if out else r.stderr[-300:]} | peak RSS {rss} MB, {res[0].split()[2] if res else '?'} s")
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
