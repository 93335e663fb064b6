"""Repro: model parameters that are views into one contiguous buffer (Megatron-core DDP's param
buffer, FSDP use_orig_params) are coded by the lossy modes as ONE leaf, the buffer's span: one
error record, under the first view's name, for the whole model. Each weight's own error (vs its
own update) is unbounded and unrecorded; the moments cannot pair (PairingWarning).
docs/LOSSY.md point 4: "Each lossy tensor records bound ... the weights' [budget] |W^ - W| / |dW|
(0.75)". Exits 1 when some view's error relative to its own update exceeds the span's recorded
rel_delta bound by >2x."""
import sys, os, tempfile, warnings
sys.path.insert(0, os.path.dirname(__file__))
from lib import *

def flatten_params(model, dtype):
    params = list(model.parameters())
    buf = torch.zeros(sum(p.numel() for p in params), dtype=dtype)
    off = 0
    for p in params:
        n = p.numel()
        buf[off:off + n].copy_(p.detach().reshape(-1))
        p.data = buf[off:off + n].view(p.shape)   # the param is now a view into the buffer
        off += n
    return buf

mode = sys.argv[1] if len(sys.argv) > 1 else "adaptive"
dtype = getattr(torch, sys.argv[2]) if len(sys.argv) > 2 else torch.float32
torch.manual_seed(0)
model = Tiny().to(dtype)
flatten_params(model, dtype)
LLRD = os.environ.get("LLRD", "1") == "1"
if LLRD:  # a lower learning rate for the embedding (layer-wise lr decay, a fine-tune)
    opt = torch.optim.AdamW([{"params": [model.embed.weight], "lr": 1e-5}, {"params": [p for n, p in model.named_parameters() if n != "embed.weight"]}], lr=1e-3, eps=1e-6)
else:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-6)
gen = torch.Generator().manual_seed(1)
def train(n):
    for _ in range(n):
        x, y = batch(gen); loss_of(model, x, y).backward(); opt.step(); opt.zero_grad(set_to_none=True)
d = tempfile.mkdtemp(dir="/tmp/hunt41/mixed")
train(5)
base_state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
ckptzip.save(base_state, f"{d}/k.ckz")
base_state = flat_copy = __import__("copy").deepcopy(base_state)
base = flat(ckptzip.load(f"{d}/k.ckz"))
train(5)
st = {"model": model.state_dict(), "optimizer": opt.state_dict()}
true = flat(st)
with warnings.catch_warnings(record=True) as ws:
    warnings.simplefilter("always")
    ckptzip.save(st, f"{d}/d.ckz", mode=mode, base=f"{d}/k.ckz")
for w in ws:
    print("warning:", w.category.__name__, str(w.message)[:140])
# the same state with each view cloned into a tensor of its own (what the contract is measured on)
cl = {"model": {k: v.clone() for k, v in st["model"].items()}, "optimizer": st["optimizer"]}
ckptzip.save({"model": {k: v.clone() for k, v in base_state["model"].items()}, "optimizer": base_state["optimizer"]}, f"{d}/kc.ckz")
cbase = flat(ckptzip.load(f"{d}/kc.ckz"))
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    ckptzip.save(cl, f"{d}/dc.ckz", mode=mode, base=f"{d}/kc.ckz")
cdec = flat(ckptzip.load(f"{d}/dc.ckz"))
dec = flat(ckptzip.load(f"{d}/d.ckz"))
hd = headers(f"{d}/d.ckz")
model_leaves = [n for n in hd if n.startswith("model")]
print(f"model tensors in the state: {sum(1 for n in true if n.startswith('model.'))}; "
      f"leaves in the file for them: {model_leaves}")
rec = hd[model_leaves[0]].extra.get("error", {})
print(f"the one record ({model_leaves[0]}, shape {tuple(hd[model_leaves[0]].shape)}): rel={rec.get('rel')} "
      f"rel_delta={rec.get('rel_delta')} bound={rec.get('bound')} budget={rec.get('budget')}")
worst = 0.0
print(f"{'tensor':24s} {'numel':>6s} {'|dW|/|W|':>9s} {'rel':>8s} {'err/|own update|':>17s} {'same, views cloned':>19s}")
for n, v in true.items():
    if not n.startswith("model."):
        continue
    upd = float((v.double() - base[n].double()).norm())
    err = float((dec[n].double() - v.double()).norm())
    rd = err / upd if upd else (float("inf") if err else 0.0)
    cupd = float((v.double() - cbase[n].double()).norm())
    crd = float((cdec[n].double() - v.double()).norm()) / cupd if cupd else 0.0
    print(f"{n:24s} {v.numel():6d} {upd/float(v.double().norm()):9.3g} {err/float(v.double().norm()):8.3g} {rd:17.3g} {crd:19.3g}")
    worst = max(worst, rd)
limit = rec.get("rel_delta") or rec.get("budget") or 0.75
print(f"worst per-tensor error relative to its own update: {worst:.3g} (the span's record: rel_delta {rec.get('rel_delta')}, budget {rec.get('budget')})")
sys.exit(1 if worst > 2 * max(limit, rec.get("budget") or 0) else 0)
