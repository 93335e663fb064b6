"""Hostile directory archives: `ckptzip -d` of a dir-sourced .ckz whose tree/source name entries
with traversal, NUL, conflicting file/dir names, a lying safetensors layout. Checks: nothing is
written outside the output directory, and each failure is a clean 'ckptzip: error:' (exit 1), never
a Python traceback."""
import contextlib, copy, io, json, os, shutil, subprocess, sys, tempfile
import common, ckptzip

S = "/tmp/hunt41/hostile/seeds"
h0, data = common.split(open(f"{S}/dir.ckz", "rb").read())
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
cases = {}

def rename(h, old, new):
    files = h["tree"]["o"]["files"]["o"]
    files[new] = files.pop(old)
    kinds = h["source"]["files"]
    kinds[new] = kinds.pop(old)

def case(name):
    def deco(f):
        h = copy.deepcopy(h0); f(h); cases[name] = h
    return deco

for evil in ["../escape.txt", "/tmp/hunt41/hostile/abs_escape.txt", "a/../../escape2.txt", "./x", "a//b", "",
             "a\x00b", "sub\\..\\..\\win.txt", "x" * 300, "\udcff"]:
    @case(f"name {evil!r:.40}")
    def _(h, evil=evil): rename(h, "config.json", evil)

@case("file then dir of same name")
def _(h):
    rename(h, "config.json", "sub")       # a file 'sub' and a file 'sub/notes.txt'
@case("dir then file of same name")
def _(h):
    files = h["tree"]["o"]["files"]["o"]
    notes = files.pop("sub/notes.txt")
    files["sub/notes.txt"] = notes  # keep; add a file called sub after
    rename(h, "config.json", "sub")
    h["tree"]["o"]["files"]["o"] = dict(reversed(list(h["tree"]["o"]["files"]["o"].items())))
@case("empty dir named like a file")
def _(h): h["source"]["empty_dirs"] = ["config.json"]
@case("empty dir traversal")
def _(h): h["source"]["empty_dirs"] = ["../evil_dir"]
@case("empty dir not str")
def _(h): h["source"]["empty_dirs"] = [5]
@case("kinds entry not a dict")
def _(h): h["source"]["files"]["model.safetensors"] = "safetensors"
@case("files node via k/v with duplicate keys")
def _(h):
    o = h["tree"]["o"]["files"]["o"]
    h["tree"]["o"]["files"] = {"t": "dict", "k": ["config.json", "config.json"], "v": [o["config.json"], o["sub/notes.txt"]]}
@case("file key that is an int")
def _(h):
    o = h["tree"]["o"]["files"]["o"]
    h["tree"]["o"]["files"] = {"t": "dict", "k": [5], "v": [o["config.json"]]}
@case("file key that is a tuple")
def _(h):
    o = h["tree"]["o"]["files"]["o"]
    h["tree"]["o"]["files"] = {"t": "dict", "k": [{"t": "tuple", "v": ["..", "x"]}], "v": [o["config.json"]]}
@case("safetensors header lacks data_offsets")
def _(h):
    h["source"]["files"]["model.safetensors"]["header"] = json.dumps({"b": {"dtype": "I64", "shape": [6]}, "a": {"dtype": "F32", "shape": [4, 4]}})
@case("safetensors header is a list")
def _(h):
    h["source"]["files"]["model.safetensors"]["header"] = "[1, 2]"
@case("safetensors header entry is a string")
def _(h):
    h["source"]["files"]["model.safetensors"]["header"] = json.dumps({"b": "x", "a": "y"})
@case("safetensors header offsets overlap (b over a)")
def _(h):
    h["source"]["files"]["model.safetensors"]["header"] = json.dumps({"b": {"dtype": "I64", "shape": [6], "data_offsets": [0, 48]}, "a": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}})
@case("safetensors header negative offsets")
def _(h):
    h["source"]["files"]["model.safetensors"]["header"] = json.dumps({"b": {"dtype": "I64", "shape": [6], "data_offsets": [-2000, -1952]}, "a": {"dtype": "F32", "shape": [4, 4], "data_offsets": [48, 112]}})
@case("safetensors header offsets 2**40 (sparse 1 TB file)")
def _(h):
    h["source"]["files"]["model.safetensors"]["header"] = json.dumps({"b": {"dtype": "I64", "shape": [6], "data_offsets": [2**40, 2**40 + 48]}, "a": {"dtype": "F32", "shape": [4, 4], "data_offsets": [48, 112]}})

problems = 0
for name, h in cases.items():
    d = os.path.join(root, "c%02d" % list(cases).index(name))
    os.makedirs(d)
    try:
        blob = common.rebuild(h, data)
    except Exception as e:
        print(f"[{name}] cannot build: {e}"); continue
    open(f"{d}/in.ckz", "wb").write(blob)
    before = set(os.listdir(root)) | set(os.listdir("/tmp/hunt41/hostile"))
    r = subprocess.run([sys.executable, "-m", "ckptzip.cli", "-d", "-q", "-o", f"{d}/out", f"{d}/in.ckz"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"})
    after = set(os.listdir(root)) | set(os.listdir("/tmp/hunt41/hostile"))
    escaped = [p for p in ["/tmp/hunt41/hostile/escape.txt", "/tmp/hunt41/hostile/abs_escape.txt", f"{root}/escape.txt",
                           f"{root}/escape2.txt", f"{root}/evil_dir", f"{d}/escape.txt", f"{d}/escape2.txt", f"{d}/evil_dir"] if os.path.lexists(p)]
    tb = "Traceback" in r.stderr
    sizes = ""
    if os.path.isdir(f"{d}/out"):
        listing = []
        for rt, ds, fs in os.walk(f"{d}/out"):
            for f in fs:
                p = os.path.join(rt, f); st = os.stat(p)
                listing.append(f"{os.path.relpath(p, d + '/out')}({st.st_size}B,{st.st_blocks*512}B on disk)")
        sizes = " files: " + ", ".join(listing)
    bad = tb or escaped or (r.returncode not in (0, 1))
    problems += bool(bad)
    last = (r.stderr.strip().splitlines() or [""])[-1]
    print(f"[{name}] rc={r.returncode}{' TRACEBACK' if tb else ''}{' ESCAPED ' + str(escaped) if escaped else ''}: {last[:200]}{sizes[:300]}")
print("PROBLEMS:", problems)
sys.exit(1 if problems else 0)
