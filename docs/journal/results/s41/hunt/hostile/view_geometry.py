"""'view' tree nodes (as_strided views of a leaf) with geometry that passes tree.py's checks
(non-negative ints below 2**63, reach inside the storage) but that torch refuses or overflows:
element counts past int64, more dims than torch allows. Expect FormatError; problem: torch's
RuntimeError escaping load / get_tensor / ckptzip -d, or a silently bogus tensor."""
import os, subprocess, sys, tempfile
import common, ckptzip, torch
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
h0, data = common.split(ckptzip.dumps({"w": torch.arange(12.0)}))
cases = {
    "numel 2**124 (stride 0)": ([2**62, 2**62], [0, 0]),
    "numel 2**64 (stride 0)": ([2**32, 2**32], [0, 0]),
    "numel 2**63-1 (stride 0)": ([2**63 - 1], [0]),
    "100 dims": ([1] * 100, [0] * 100),
    "65 dims of 2": ([2] * 65, [0] * 65),
}
problems = 0
for name, (shape, stride) in cases.items():
    h = dict(h0, tree={"t": "dict", "o": {"w": {"t": "tensor", "i": 0},
                                          "v": {"t": "view", "i": 0, "offset": 0, "shape": shape, "stride": stride}}})
    p = f"{root}/v.ckz"; open(p, "wb").write(common.rebuild(h, data))
    for what, fn in [("load", lambda: ckptzip.load(p)), ("get_tensor", lambda: ckptzip.open(p).get_tensor("v")),
                     ("verify", lambda: ckptzip.open(p).verify())]:
        try:
            out = fn()
            t = out["v"] if isinstance(out, dict) else out
            msg = "OK" if what == "verify" else f"returned tensor shape {tuple(t.shape)[:4]}{'...' if t.dim() > 4 else ''} dims={t.dim()} numel={t.numel()}"
        except ckptzip.Error as e:
            msg = f"ckptzip.{type(e).__name__}: {str(e)[-80:]}"
        except Exception as e:
            problems += 1; msg = f"NOT ckptzip.Error: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
        print(f"[{name}] {what}: {msg}")
    r = subprocess.run([sys.executable, "-m", "ckptzip.cli", "verify", p], capture_output=True, text=True,
                       env={**os.environ, "CKPTZIP_MALLOC": "system", "PYTHONPATH": "/work/main/src"})
    tb = "Traceback" in r.stderr; problems += tb
    print(f"[{name}] ckptzip verify: rc={r.returncode}{' TRACEBACK: ' + r.stderr.strip().splitlines()[-1][:90] if tb else ''}")
print("PROBLEMS:", problems); sys.exit(1 if problems else 0)
