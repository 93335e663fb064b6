import numpy as np, torch
def diff(e, a, path="", out=None, approx=False):
    """list of differences (bit-exact unless approx)."""
    out = [] if out is None else out
    if type(a) is not type(e) and not (isinstance(e, np.generic) and isinstance(a, np.generic)):
        out.append(f"{path}: type {type(e).__name__} -> {type(a).__name__}"); return out
    if isinstance(e, torch.Tensor):
        if e.dtype != a.dtype or e.shape != a.shape:
            out.append(f"{path}: {e.dtype}{tuple(e.shape)} -> {a.dtype}{tuple(a.shape)}"); return out
        eb = e.contiguous().reshape(-1).view(torch.uint8) if e.numel() else e
        ab = a.contiguous().reshape(-1).view(torch.uint8) if a.numel() else a
        if e.numel() and not torch.equal(eb, ab):
            if approx and e.is_floating_point():
                err = (e.double() - a.double()).abs().max().item()
                out.append(f"{path}: max|diff|={err:.3g}")
            else:
                n = (e != a).sum().item() if e.dtype != torch.bool else (e ^ a).sum().item()
                out.append(f"{path}: {n}/{e.numel()} elements differ")
    elif isinstance(e, (np.ndarray, np.generic)):
        if e.dtype != a.dtype or np.shape(e) != np.shape(a) or np.asarray(e).tobytes() != np.asarray(a).tobytes():
            out.append(f"{path}: numpy differs {e!r} -> {a!r}"[:200])
    elif isinstance(e, dict):
        if list(e) != list(a):
            out.append(f"{path}: keys {list(e)[:6]} -> {list(a)[:6]}")
        for k in e:
            if k in a: diff(e[k], a[k], f"{path}.{k}", out, approx)
    elif isinstance(e, (list, tuple)):
        if len(e) != len(a): out.append(f"{path}: len {len(e)} -> {len(a)}")
        for i, (x, y) in enumerate(zip(e, a)): diff(x, y, f"{path}[{i}]", out, approx)
    elif isinstance(e, float):
        if not (e == a or (e != e and a != a)): out.append(f"{path}: {e!r} -> {a!r}")
    else:
        if e != a: out.append(f"{path}: {e!r} -> {a!r}")
    return out
def ties(st):
    return (st["model"]["emb.weight"].data_ptr() == st["model"]["head.weight"].data_ptr(),
            st["extra"]["alias"].data_ptr() == st["extra"]["bf16"].data_ptr())
def resolve(st, key):
    cur = st
    for part in key.split("."):
        if isinstance(cur, dict):
            cur = cur[part] if part in cur else cur[int(part)]
        else:
            cur = cur[int(part)]
    return cur
def check_errors(path, truth, decoded_state=None):
    """each leaf: exact if no error record, else measured rel within bound and close to recorded rel."""
    import ckptzip
    bad = []
    with ckptzip.open(path) as c:
        dec = decoded_state if decoded_state is not None else ckptzip.load(path)
        for leaf in c.leaves:
            try: t = resolve(truth, leaf.name)
            except Exception: continue
            a = resolve(dec, leaf.name) if dec is not None else c.get_tensor(leaf.name)
            if isinstance(t, (bytes, str)) or t is None: continue
            tt = torch.as_tensor(t); aa = torch.as_tensor(a)
            err = leaf.error
            if not err or err.get("unchanged"):
                if diff(tt, aa): bad.append(f"{leaf.name}: not exact but no error recorded")
                continue
            if err.get("domain") == "step": continue
            x = tt.double(); xh = aa.double()
            rel = ((xh - x).norm() / x.norm()).item() if x.norm() > 0 else 0.0
            if "bound" in err and rel > err["bound"] * 1.001 + 1e-12: bad.append(f"{leaf.name}: rel {rel:.4g} > bound {err['bound']}")
            if abs(rel - err["rel"]) > 0.01 * max(err["rel"], 1e-6) + 1e-6: bad.append(f"{leaf.name}: rel {rel:.4g} recorded {err['rel']}")
    return bad
