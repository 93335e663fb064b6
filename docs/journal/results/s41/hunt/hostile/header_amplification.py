"""Memory and time of opening (and failing to load) a file whose deflated header is padded with
spaces (allowed) so that the 256x inflate bound admits a JSON of many tiny leaves. Measures peak RSS
and seconds per MB of file, in a subprocess. Reports amplification = peak RSS growth / file size."""
import os, subprocess, sys, tempfile, zlib, json
import common, ckptzip, torch
from ckptzip.container import pack_prelude, FLAG_DEFLATE
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
h0, data = common.split(ckptzip.dumps({"w": torch.randn(4)}))
results = []
for n_leaves in (0, 200_000, 800_000):
    leaf = {"dtype": "float32", "shape": [0], "pipeline": 0, "offset": 0, "chunks": []}
    h = dict(h0, leaves=h0["leaves"] + [leaf] * n_leaves)
    body = json.dumps(h, separators=(",", ":")).encode()
    z = zlib.compress(body, 9)
    need = max(len(z), (len(body) - (1 << 20)) // 256 + 1)
    stored = z + b" " * (need - len(z))
    blob = pack_prelude(stored, FLAG_DEFLATE) + stored + data
    p = f"{root}/amp{n_leaves}.ckz"; open(p, "wb").write(blob)
    prog = ("import sys, time, resource; sys.path.insert(0,'/work/main/src'); import ckptzip\n"
            "r0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; t = time.time()\n"
            f"try:\n    s = ckptzip.load({p!r}, threads=1); print('loaded', len(s))\n"
            "except ckptzip.Error as e:\n    print('error', type(e).__name__, str(e)[:100])\n"
            "print('RESULT', (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - r0)//1024, round(time.time()-t, 1))")
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "CKPTZIP_MALLOC": "system"})
    line = [l for l in r.stdout.splitlines() if l.startswith("RESULT")]
    grow, secs = (line[0].split()[1:] if line else ("?", "?"))
    print(f"leaves {n_leaves:>7}: file {len(blob)/1e6:.2f} MB (JSON {len(body)/1e6:.0f} MB): "
          f"RSS growth {grow} MB in {secs} s; {r.stdout.splitlines()[0][:80] if r.stdout else r.stderr[-200:]}")
    if grow != "?" and len(blob) > 100_000:
        results.append(int(grow) / (len(blob) / 1e6))
amp = max(results) if results else 0
print(f"worst amplification: {amp:.0f} MB of RSS per MB of file")
sys.exit(1 if amp > 1000 else 0)
