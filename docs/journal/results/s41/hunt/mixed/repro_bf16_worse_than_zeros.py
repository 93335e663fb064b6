"""Repro: the 16-bit "no worse than nothing" allowance (2 + 2^-8, modes/common.py NO_WORSE_NARROW)
lets the adaptive mode decode a bf16 exp_avg_sq farther from the truth than zeros are (rel > 1),
where the same values saved as fp32 are held to 1 + 2^-9. Rounding the decoded value to bf16 moves
it by at most 2^-8 of itself (unit roundoff), so |r - x| <= |x^ - x| + 2^-8 |x^| <= |x| (1 + 2^-7):
rounding explains an excess of 0.8% over "no worse than zeros", not 2x.
One bf16 AdamW run; each checkpoint saved twice in lockstep: as is (bf16), and cast to fp32
(the same values, exactly). Exits 1 when the bf16 moment decodes with rel > 1 + 2^-7."""
import sys, os, tempfile, warnings
sys.path.insert(0, os.path.dirname(__file__))
from lib import *

def cast(tree, dtype):
    if isinstance(tree, dict): return {k: cast(v, dtype) for k, v in tree.items()}
    if isinstance(tree, list): return [cast(v, dtype) for v in tree]
    if isinstance(tree, torch.Tensor) and tree.dtype == torch.bfloat16: return tree.to(dtype)
    return tree

torch.manual_seed(0)
model = Tiny().to(torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, eps=1e-6)
gen = torch.Generator().manual_seed(1)
def train(n):
    for _ in range(n):
        x, y = batch(gen); x = x % 64   # half the vocabulary unseen: sparse embedding moments
        loss_of(model, x, y).backward(); opt.step(); opt.zero_grad(set_to_none=True)
d = tempfile.mkdtemp(dir="/tmp/hunt41/mixed")
train(5)
prev = {}
for dt in ("bf16", "fp32"):
    st = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    prev[dt] = f"{d}/{dt}-k.ckz"
    ckptzip.save(st if dt == "bf16" else cast(st, torch.float32), prev[dt])
worst = 0.0
for k in range(10):
    train(5)
    st = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    true = flat(st)
    line = []
    for dt in ("bf16", "fp32"):
        p = f"{d}/{dt}-{k}.ckz"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ckptzip.save(st if dt == "bf16" else cast(st, torch.float32), p, mode="adaptive", base=prev[dt])
        dec = flat(ckptzip.load(p)); hd = headers(p)
        n = "optimizer.state.0.exp_avg_sq"
        r = rel(dec[n], true[n])
        rec = hd[n].extra.get("error", {})
        line.append(f"{dt}: rel {r:.4f} (header rel {rec.get('rel')}, bound {rec.get('bound')}, rel_sqrt {rec.get('rel_sqrt')})")
        if dt == "bf16":
            worst = max(worst, r)
        prev[dt] = p
    print(f"delta {k}: {n}  " + " | ".join(line))
print(f"worst bf16 exp_avg_sq rel: {worst:.4f}; zeros would give 1.0; bf16 rounding accounts for <= {1 + 2**-7:.4f}; header bound 2.004")
sys.exit(1 if worst > 1 + 2**-7 else 0)
