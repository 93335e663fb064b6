"""Semantic header fuzzer: mutate one JSON value of a seed's header (CRCs and id recomputed so the
mutation reaches the parser), then run every entry point: load, open/keys/get_tensor/verify, and the
CLI's inspect, inspect --json, verify, decompress. Any exception escaping that is not a
ckptzip.Error (or, for the CLI, any exception escaping main()) is recorded with its site."""
import contextlib, copy, io, json, hashlib, math, os, random, signal, sys, traceback, zlib, resource, shutil
import common, ckptzip, torch
from ckptzip.container import pack_prelude, FLAG_DEFLATE
from ckptzip.cli import main

S = "/tmp/hunt41/hostile/seeds"
W = "/tmp/hunt41/hostile/work"
os.makedirs(W, exist_ok=True)
for f in os.listdir(S):
    if f.endswith(".ckz"):
        shutil.copy(f"{S}/{f}", f"{W}/{f}")
SEEDS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["mixed", "delta", "excp", "bitsnap", "adaptive", "adaptive2", "dir", "st"]
N = int(sys.argv[1]) if len(sys.argv) > 1 else 300
rng = random.Random(int(os.environ.get("SEED", "1")))

def dump(h):
    h = dict(h); h.pop("id", None)
    body = json.dumps(h, separators=(",", ":"), ensure_ascii=False, allow_nan=True).encode()
    fid = hashlib.sha256(body).hexdigest()[:32]
    body = body[:-1] + b',"id":"' + fid.encode() + b'"}'
    st = zlib.compress(body)
    return pack_prelude(st, FLAG_DEFLATE) + st

HOSTILE = [None, True, False, 0, 1, -1, 2, 3, 7, 255, 256, 65535, 2**31, 2**32, 2**53, 2**63, 2**64, -2**63,
           10**30, 0.5, -0.0, 1e308, float("nan"), float("inf"), float("-inf"), "", "x", "../../etc/passwd",
           "/etc/passwd", "s3://bucket/x.ckz", "float32", "uint8", "bool", "complex64", "float8_e4m3fn",
           [], [0], [-1], [2**62, 2**62], [[]], {}, {"t": "tensor", "i": 0}, {"id": "entropy"}, "\x00"]

def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))

def get(node, p):
    for k in p: node = node[k]
    return node

def mutate(h):
    h = copy.deepcopy(h)
    all_paths = [p for p in paths(h) if p and p[0] != "id" and (not os.environ.get("FOCUS") or p[0] in os.environ["FOCUS"].split(","))]
    p = rng.choice(all_paths)
    parent = get(h, p[:-1]); key = p[-1]
    r = rng.random()
    old = parent[key]
    if r < 0.12 and isinstance(parent, dict):
        del parent[key]; return h, f"del {p}"
    if r < 0.2 and isinstance(parent, list):
        parent.insert(key, copy.deepcopy(old)); return h, f"dup {p}"
    if r < 0.3 and isinstance(old, float):
        new = rng.choice([old * 2, -old, old * 1e30, old / 1e30, 0.0, old + 1])
    elif r < 0.3 and isinstance(old, int) and not isinstance(old, bool):
        new = old + rng.choice([-1, 1, 2, -2, 1000, old, -old - 1])
    elif r < 0.38 and isinstance(old, str):
        new = rng.choice([old + "x", old[:-1], old.upper(), "a/../" + old])
    else:
        new = rng.choice(HOSTILE)
    parent[key] = new
    return h, f"set {p} = {new!r:.60} (was {old!r:.40})"

class Timeout(BaseException): pass
def alarm(*a): raise Timeout()
signal.signal(signal.SIGALRM, alarm)

findings = {}
def run(name, fn, what):
    signal.alarm(20)
    try:
        fn()
    except ckptzip.Error:
        pass
    except Timeout:
        findings.setdefault(("HANG", name), what)
    except BaseException as e:
        tb = traceback.extract_tb(e.__traceback__)
        site = f"{tb[-1].filename.split('/')[-1]}:{tb[-1].name}:{tb[-1].lineno}"
        key = (name, type(e).__name__, site)
        if key not in findings:
            findings[key] = f"{what} -> {type(e).__name__}: {str(e)[:150]}"
    finally:
        signal.alarm(0)

def cli(args):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        main(args)

def api_open(path):
    with ckptzip.open(path, threads=1) as c:
        _ = c.metadata, c.mode, c.id, c.chain_depth, c.base_ref
        for k in c.keys()[:6]:
            c.get_tensor(k)
        c.verify()

headers = {s: common.split(open(f"{S}/{s}.ckz", "rb").read()) for s in SEEDS}
for it in range(N):
    seed = SEEDS[it % len(SEEDS)]
    h, data = headers[seed]
    mh, what = mutate(h)
    what = f"{seed}: {what}"
    path = f"{W}/m_{seed}.ckz"
    try:
        blob = dump(mh) + data
    except Exception as e:
        continue
    open(path, "wb").write(blob)
    run("load", lambda: ckptzip.load(path, threads=1), what)
    run("open", lambda: api_open(path), what)
    run("cli inspect", lambda: cli(["inspect", path]), what)
    run("cli inspect --json", lambda: cli(["inspect", "--json", path]), what)
    run("cli verify", lambda: cli(["verify", "-T", "1", path]), what)
    out = f"{W}/out_{seed}"
    run("cli decompress", lambda: cli(["-d", "-f", "-q", "-T", "1", "-o", out, path]), what)
    if os.path.isdir(out): shutil.rmtree(out)
    elif os.path.exists(out): os.remove(out)
for k, v in findings.items():
    print(k, "\n    ", v)
print("iterations", N, "findings", len(findings), "peak RSS MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)
