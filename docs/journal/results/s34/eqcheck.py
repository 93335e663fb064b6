import numpy as np, torch, time
from ckptzip.modes import quantize as Q
rng = np.random.default_rng(0)
bad = 0; total = 0; tn = tp = 0
for trial in range(3000):
    n = int(rng.choice([0, 1, 2, 3, 7, 50, 384, 1000, 5000, 70000, 131072]))
    kind = trial % 6
    x = rng.standard_normal(n)
    if kind == 1: x = rng.standard_t(2, n)
    if kind == 2: x[rng.random(n) < 0.7] = 0
    if kind == 3: x = np.abs(x) * 1e-8
    if kind == 4: x = np.full(n, 0.25)
    if kind == 5: x = np.round(x * 4) / 4
    t = torch.from_numpy(x.astype(np.float32))
    ordered = Q.ascending(t)
    energy = float((ordered ** 2).sum())
    scale_sq = max(energy * float(rng.choice([1.0, 0.3, 3.0])), 1e-300)
    budget = float(rng.choice([0.0, 0.01, 0.05, 0.1, 0.3, 0.7, 1.5]))
    kmeans = bool(rng.random() < 0.7)
    a = time.perf_counter(); nat = Q._native_search(ordered, scale_sq, budget, kmeans); b = time.perf_counter()
    ref = Q._search_sorted(ordered, scale_sq, budget, kmeans); c = time.perf_counter()
    tn += b - a; tp += c - b
    total += 1
    if nat != ref:
        bad += 1
        if bad < 10: print("MISMATCH", n, kind, budget, kmeans, nat, ref)
print(f"{bad}/{total} mismatches; native {tn:.2f} s, python {tp:.2f} s")
