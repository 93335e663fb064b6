"""Shared helpers for the mixed-precision lossy hunt."""
import os, sys, math, warnings
os.environ.setdefault("CKPTZIP_MALLOC", "system")
import torch, torch.nn as nn
import ckptzip

torch.set_num_threads(1)
VOCAB = 128

class Tiny(nn.Module):
    def __init__(self, d=64, tied=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight
    def forward(self, x):
        h = self.embed(x)
        h = h + self.fc2(torch.relu(self.fc1(h)))
        return self.head(self.ln(h))

def batch(gen, n=16, t=8, noise=0.5):
    x = torch.randint(0, VOCAB, (n, t), generator=gen)
    y = (x * 7 + 3) % VOCAB  # learnable mapping
    r = torch.randint(0, VOCAB, (n, t), generator=gen)
    flip = torch.rand((n, t), generator=gen) < noise  # irreducible label noise: loss floor > 0
    return x, torch.where(flip, r, y)

def loss_of(model, x, y):
    logits = model(x).float()
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))

def flat(state, prefix=""):
    out = {}
    if isinstance(state, dict):
        for k, v in state.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(state, (list, tuple)):
        for i, v in enumerate(state):
            out.update(flat(v, f"{prefix}.{i}" if prefix else str(i)))
    else:
        out[prefix] = state.detach().clone() if isinstance(state, torch.Tensor) else state
    return out

def bits(t):
    return t.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])

def headers(path):
    with ckptzip.open(path) as c:
        return {leaf.name: leaf for leaf in c.leaves}

def rel(a, b):
    a, b = a.double(), b.double()
    n = float(b.norm())
    return float((a - b).norm()) / n if n else float((a - b).norm() > 0)

def compare(path, true, decoded, base_true=None):
    """Per-tensor rows: name, dtype, lossy?, rel err vs true, header rel, bound, neg flips."""
    leaves = headers(path)
    rows = []
    for name, v in true.items():
        if not isinstance(v, torch.Tensor):
            continue
        g = decoded[name]
        leaf = leaves.get(name)
        rec = leaf.extra.get("error") if leaf is not None else None
        r = rel(g, v) if v.is_floating_point() else (0.0 if torch.equal(g, v) else 1.0)
        negflip = int(((g < 0) & (v >= 0)).sum()) if (v.is_floating_point() and not bool((v < 0).any())) else 0
        exact = torch.equal(bits(g), bits(v)) if g.dtype == v.dtype and g.shape == v.shape else False
        rows.append(dict(name=name, dtype=str(v.dtype).replace("torch.", ""), rel=r, exact=exact,
                         hrel=None if not rec else rec.get("rel"), bound=None if not rec else rec.get("bound"),
                         domain=None if not rec else rec.get("domain"), negflip=negflip,
                         unchanged=bool(leaf is not None and leaf.extra.get("unchanged")),
                         pipeline=None if leaf is None else [s["id"] for s in leaf.pipeline.get_config()]))
    return rows

def check_chain(make_state, step, mode, deltas=5, resumed=False, label="", verbose=False, **opts):
    """make_state() -> state dict; step() trains. Saves a keyframe then `deltas` deltas; checks
    the contract per tensor. Returns list of problem strings and the per-delta rows."""
    import tempfile
    d = tempfile.mkdtemp(dir="/tmp/hunt41/mixed")
    step()
    prev = f"{d}/k.ckz"
    with warnings.catch_warnings(record=True) as w0:
        warnings.simplefilter("always")
        ckptzip.save(make_state(), prev, mode=mode)
    base_dec = flat(ckptzip.load(prev))
    problems, allrows, warns = [], [], []
    for k in range(deltas):
        step()
        st = make_state()
        true = flat(st)
        p = f"{d}/d{k}.ckz"
        with warnings.catch_warnings(record=True) as ws:
            warnings.simplefilter("always")
            ckptzip.save(st, p, mode=mode, base=prev, resumed=resumed, **opts)
        warns += [f"{x.category.__name__}: {str(x.message)[:200]}" for x in ws]
        dec = flat(ckptzip.load(p))
        hd = headers(p)
        rows = []
        for n, v in true.items():
            g = dec[n]
            if not isinstance(v, torch.Tensor):
                if g != v and not (isinstance(v, float) and math.isnan(v) and math.isnan(g)):
                    problems.append(f"d{k} {n}: non-tensor {v!r} -> {g!r}")
                continue
            if g.dtype != v.dtype or g.shape != v.shape:
                problems.append(f"d{k} {n}: dtype/shape {v.dtype}{tuple(v.shape)} -> {g.dtype}{tuple(g.shape)}")
                continue
            leaf = hd.get(n)
            rec = None if leaf is None else leaf.extra.get("error")
            if rec is None:
                if leaf is not None and not torch.equal(bits(g), bits(v)):
                    problems.append(f"d{k} {n}: stored without error record but not bit-exact (rel {rel(g, v):.3g})")
                rows.append((n, str(v.dtype), "exact" if torch.equal(bits(g), bits(v)) else f"{rel(g,v):.3g}", None, None))
                continue
            want, have = v.double(), g.double()
            if rec.get("domain") == "step":
                scale = dec[n + "_sq"].double().sqrt() if n.endswith("exp_avg") else None
                if scale is not None:
                    scale = scale.where(scale > 0, 1.0)
                    want, have = want / scale, have / scale
            r = float((have - want).norm()) / max(float(want.norm()), 1e-300)
            if r > rec["bound"] * 1.0001:
                problems.append(f"d{k} {n} ({v.dtype}): rel {r:.4g} > header bound {rec['bound']}")
            if abs(r - rec["rel"]) > 2e-3 * max(r, 1e-6) + 1e-9:
                problems.append(f"d{k} {n} ({v.dtype}): measured rel {r:.4g} != header rel {rec['rel']}")
            if not bool((v < 0).any()) and bool((g < 0).any()):
                problems.append(f"d{k} {n} ({v.dtype}): {int((g<0).sum())} negative values decoded from a non-negative tensor")
            if not bool(torch.isfinite(g).all()):
                problems.append(f"d{k} {n}: non-finite decoded")
            b = base_dec.get(n)
            if isinstance(b, torch.Tensor) and b.shape == v.shape and b.dtype == v.dtype:
                pipe = [s["id"] for s in leaf.pipeline.get_config()]
                if pipe and pipe[0] == "lossy-residual":
                    still = bits(v) == bits(b)
                    nbad = int((bits(g)[still] != bits(v)[still]).sum())
                    if nbad:
                        problems.append(f"d{k} {n}: {nbad} unchanged elements moved")
            if any(s in n for s in ("exp_avg", "momentum_buffer")):
                nz = int((g[v == 0] != 0).sum())
                if nz:
                    problems.append(f"d{k} {n}: {nz} zero moment elements decoded non-zero")
            rows.append((n, str(v.dtype), f"{r:.3g}", rec["bound"], rec.get("domain")))
        allrows.append(rows)
        base_dec = dec
        prev = p
    return problems, allrows, sorted(set(warns))
