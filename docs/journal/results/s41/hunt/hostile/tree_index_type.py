"""A tree node whose leaf index is a JSON list or object ({"t": "tensor", "i": [0]}) instead of an int.
Expect FormatError from every entry point (verify does give one). Problem: load/get_tensor/`ckptzip -d`
raise TypeError (unhashable type) out of reader.CheckpointFile._build."""
import contextlib, io, os, sys, subprocess, tempfile
import common, ckptzip, torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
blob = ckptzip.dumps({"w": torch.randn(10), "b": torch.ones(3)})
problems = 0
for bad_index in ([0], {"x": 1}):
    h, data = common.split(blob)
    h["tree"]["o"]["w"]["i"] = bad_index
    p = f"{root}/bad.ckz"
    open(p, "wb").write(common.rebuild(h, data))
    for name, fn in [("load", lambda: ckptzip.load(p)), ("loads", lambda: ckptzip.loads(open(p, "rb").read())),
                     ("open().get_tensor('b')", lambda: ckptzip.open(p).get_tensor("b")),
                     ("open().verify()", lambda: ckptzip.open(p).verify())]:
        try:
            fn(); print(f"i={bad_index!r} {name}: loaded"); 
        except ckptzip.Error as e:
            print(f"i={bad_index!r} {name}: ckptzip.{type(e).__name__}: {str(e)[:100]}")
        except Exception as e:
            problems += 1; print(f"i={bad_index!r} {name}: NOT a ckptzip.Error: {type(e).__name__}: {e}")
    r = subprocess.run([sys.executable, "-m", "ckptzip.cli", "-d", "-q", "-f", "-o", f"{root}/o.pt", p], capture_output=True, text=True,
                       env={**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"})
    tb = "Traceback" in r.stderr; problems += tb
    print(f"i={bad_index!r} ckptzip -d: rc={r.returncode}{' TRACEBACK' if tb else ''}: {r.stderr.strip().splitlines()[-1][:120]}")
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
