"""Every truncation and a single-byte flip at every position of a small lossless delta and its base,
read through an object-store URL (fsspec memory://: RemoteSource's ranged reads, read-ahead and head
fetch, a code path test_corruption.py's local-file loops do not take). Expect ckptzip.Error or the
exact original; record any other exception, hang or silently wrong value."""
import signal, sys, traceback, collections
sys.path.insert(0, "/work/main/fuzz")
import common, ckptzip, torch, fsspec, fuzz_states
fs = fsspec.filesystem("memory")
base = ckptzip.dumps(fuzz_states.base_state(), threads=1)
fs.pipe("/b/base.ckz", base)
import tempfile, os
d = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
open(f"{d}/base.ckz", "wb").write(base)
ckptzip.save(fuzz_states.next_state(), f"{d}/delta.ckz", base=f"{d}/base.ckz", threads=1)
delta = open(f"{d}/delta.ckz", "rb").read()
expected = ckptzip.load(f"{d}/delta.ckz", threads=1)
def same(a, b):
    if isinstance(a, torch.Tensor): return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.view(-1).view(torch.uint8), b.view(-1).view(torch.uint8))
    if isinstance(a, dict): return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)): return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
class TO(BaseException): pass
def al(*a): raise TO()
signal.signal(signal.SIGALRM, al)
tally = collections.Counter(); bad = []
def attempt(what, target, blob):
    fs.pipe(target, blob)
    signal.alarm(20)
    try:
        out = ckptzip.load("memory://b/delta.ckz", threads=2)
        if same(out, expected): tally["exact"] += 1
        else: tally["WRONG"] += 1; bad.append(f"{what}: silently wrong")
    except ckptzip.Error as e:
        tally[type(e).__name__] += 1
    except TO:
        tally["HANG"] += 1; bad.append(f"{what}: hang")
    except BaseException as e:
        tally["OTHER"] += 1; bad.append(f"{what}: {type(e).__name__}: {str(e)[:100]} @ {traceback.extract_tb(e.__traceback__)[-1].name}")
    finally:
        signal.alarm(0)
fs.pipe("/b/delta.ckz", delta)
for name, blob in (("delta", delta), ("base", base)):
    target = f"/b/{name}.ckz"
    for cut in range(0, len(blob), 1):
        attempt(f"{name} cut {cut}", target, blob[:cut])
    masks = [1, 2, 4, 8, 16, 32, 64, 128, 0xFF]
    for pos in range(len(blob)):
        b = bytearray(blob); b[pos] ^= masks[pos % len(masks)]
        attempt(f"{name} flip {pos}", target, bytes(b))
    fs.pipe(target, blob)
print(dict(tally)); print("\n".join(bad[:20]))
sys.exit(1 if bad else 0)
