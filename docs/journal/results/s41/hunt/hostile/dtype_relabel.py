"""Every dtype name ckptzip accepts in a header (all of torch's, see dtypes._build_tables), put on a
16-byte leaf (shape adjusted), as tensor and as ndarray node; then load / get_tensor / verify, and the
CLI's `-d --to pt` and `-d --to safetensors`. Expect a value or ckptzip.Error / 'ckptzip: error:'."""
import contextlib, io, os, sys, tempfile, traceback
import common, ckptzip, torch
from ckptzip.dtypes import _BY_NAME
from ckptzip.cli import main
root = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
h0, data = common.split(ckptzip.dumps({"u": torch.arange(16, dtype=torch.uint8)}))
assert h0["pipelines"][h0["leaves"][0]["pipeline"]] == [{"id": "entropy"}], h0["pipelines"]
problems = []
for name, dt in sorted(_BY_NAME.items()):
    if 16 % dt.itemsize: continue
    for node in ("tensor", "ndarray"):
        leaf = dict(h0["leaves"][0], dtype=name, shape=[16 // dt.itemsize])
        h = dict(h0, leaves=[leaf], tree={"t": "dict", "o": {"u": {"t": node, "i": 0}}})
        p = f"{root}/d.ckz"; open(p, "wb").write(common.rebuild(h, data))
        for what, fn in [("load", lambda: ckptzip.load(p, threads=1)), ("verify", lambda: ckptzip.open(p).verify()),
                         ("get_tensor", lambda: ckptzip.open(p).get_tensor("u"))]:
            try: fn()
            except ckptzip.Error: pass
            except Exception as e:
                problems.append(f"{name} {node} {what}: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
        for to in ("pt", "safetensors"):
            err = io.StringIO()
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    main(["-d", "-f", "-q", "--to", to, "-o", f"{root}/out.{to}", p])
            except Exception as e:
                problems.append(f"{name} {node} ckptzip -d --to {to}: traceback {type(e).__name__}: {str(e).strip().splitlines()[0][:100]}")
print("\n".join(problems)); print("PROBLEMS:", len(problems)); sys.exit(1 if problems else 0)
