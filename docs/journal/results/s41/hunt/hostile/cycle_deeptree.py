"""A self-referencing delta (base.id null, base.path = its own name) whose tree is nested N deep
(the format allows 256). The load recursion into 'its base' ends only at Python's recursion
limit, and what raises there depends on which code is deepest: expect ckptzip.Error always."""
import os, sys, tempfile, collections, traceback
import common, ckptzip, torch
d = tempfile.mkdtemp(dir="/tmp/hunt41/hostile")
torch.manual_seed(0)
s0 = {"w": torch.randn(256)}
s1 = {"w": s0["w"] + 0.001}
ckptzip.save(s0, f"{d}/a.ckz"); ckptzip.save(s1, f"{d}/b.ckz", base=f"{d}/a.ckz")
h, data = common.split(open(f"{d}/b.ckz", "rb").read())
h["base"] = {"id": None, "path": "self.ckz"}
seen = collections.Counter()
for depth in (0, 50, 100, 150, 200, 250):
    z = 1
    for _ in range(depth):
        z = {"t": "list", "v": [z]}
    tree = {"t": "dict", "o": dict(h["tree"]["o"], z=z)}
    hh = dict(h, tree=tree)
    open(f"{d}/self.ckz", "wb").write(common.rebuild(hh, data))
    for how in ("load", "open", "inspect-cli"):
        try:
            if how == "load":
                ckptzip.load(f"{d}/self.ckz", threads=1)
            elif how == "open":
                with ckptzip.open(f"{d}/self.ckz") as c:
                    c.get_tensor(c.keys()[0])
            else:
                from ckptzip.cli import main
                import contextlib, io
                with contextlib.redirect_stderr(io.StringIO()):
                    rc = main(["verify", f"{d}/self.ckz"])
                assert rc == 1, rc
                raise ckptzip.Error("cli rc 1")
            seen[f"depth {depth} {how}: LOADED"] += 1
        except ckptzip.Error as e:
            seen[f"depth {depth} {how}: ckptzip {type(e).__name__} len={len(str(e))} ...{str(e)[-70:]}"] += 1
        except BaseException as e:
            seen[f"depth {depth} {how}: NON-CKPTZIP {type(e).__name__}: {str(e)[:80]} at {traceback.extract_tb(e.__traceback__)[-1].name}"] += 1
bad = 0
for k in seen:
    print(k); bad += "NON-CKPTZIP" in k
sys.exit(1 if bad else 0)
