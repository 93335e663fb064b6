"""Random tree nodes of every kind with hostile field values, in a valid file: load / get_tensor /
verify must raise ckptzip.Error or return; record anything else."""
import random, sys, traceback, signal
import common, ckptzip, torch, numpy as np
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 3)
state = {"f": torch.arange(12.0), "u8": torch.arange(6, dtype=torch.uint8), "b": torch.tensor([True, False]),
         "h": torch.arange(4, dtype=torch.float16), "c": torch.ones(2, dtype=torch.complex64), "i": torch.arange(3)}
h0, data = common.split(ckptzip.dumps(state))
n = len(h0["leaves"])
VALS = [None, True, 0, 1, -1, 2, 5, n, 2**31, 2**63 - 1, 2**63, 2**64, -2**63, 0.5, float("nan"), "", "x", ">", "<",
        "float32", "uint8", "bool", "complex64", "cpu", "cuda:99", "meta", "nan", "inf", "00", "zz", "0000803f",
        [], [0], [1], [-1], [2**62, 2**62], [1, 2, 3], [[1]], {}, {"t": "tensor", "i": 0}]
KINDS = ["dict", "list", "tuple", "tensor", "view", "ndarray", "bytes", "bytearray", "float", "complex", "npscalar",
         "dtype", "device", "size", "exec"]
FIELDS = ["i", "v", "o", "k", "m", "ordered", "param", "grad", "offset", "shape", "stride", "dtype", "bo"]
def node(depth=0):
    if depth > 3 or rng.random() < 0.2:
        return rng.choice(VALS)
    kind = rng.choice(KINDS)
    nd = {"t": kind}
    for f in rng.sample(FIELDS, rng.randint(0, 5)):
        nd[f] = rng.choice(VALS) if rng.random() < 0.8 else node(depth + 1)
    if kind in ("tensor", "view", "ndarray", "bytes", "bytearray") and rng.random() < 0.8:
        nd["i"] = rng.randrange(n)
    if kind == "view" and rng.random() < 0.7:
        d = rng.randint(0, 3)
        nd.update(offset=rng.choice([0, 1, 2**62]), shape=[rng.choice([0, 1, 3, 2**31, 2**62]) for _ in range(d)],
                  stride=[rng.choice([0, 1, 2, 2**62]) for _ in range(d)])
    if kind in ("list", "tuple") and rng.random() < 0.7:
        nd["v"] = [node(depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == "dict" and rng.random() < 0.7:
        if rng.random() < 0.5:
            nd["o"] = {str(j): node(depth + 1) for j in range(rng.randint(0, 3))}
        else:
            m = rng.randint(0, 3); nd["k"] = [node(depth + 1) for _ in range(m)]; nd["v"] = [node(depth + 1) for _ in range(m)]
    return nd
class TO(BaseException): pass
def al(*a): raise TO()
signal.signal(signal.SIGALRM, al)
found = {}
N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
import json
for it in range(N):
    tree = {"t": "dict", "o": {"x": node(), "f": {"t": "tensor", "i": 0}}}
    h = dict(h0, tree=tree)
    try:
        blob = common.rebuild(h, data)
    except Exception:
        body = json.dumps(tree)
        continue
    for what, fn in [("loads", lambda: ckptzip.loads(blob, threads=1)),
                     ("verify", lambda: ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob), threads=1).verify()),
                     ("keys/get", lambda: [c.get_tensor(k) for c in [ckptzip.CheckpointFile(ckptzip.storage.BytesSource(blob), threads=1)] for k in c.keys()])]:
        signal.alarm(10)
        try:
            fn()
        except ckptzip.Error:
            pass
        except TO:
            found.setdefault(("HANG", what), json.dumps(tree)[:300])
        except BaseException as e:
            tb = traceback.extract_tb(e.__traceback__)
            key = (what, type(e).__name__, f"{tb[-1].filename.split('/')[-1]}:{tb[-1].name}")
            found.setdefault(key, f"{str(e).splitlines()[0][:100]} <- {json.dumps(tree['o']['x'])[:300]}")
        finally:
            signal.alarm(0)
for k, v in found.items():
    print(k, "\n   ", v)
print("iterations", N, "distinct", len(found))
