"""The lossy path's element-wise kernels, one at a time: ns per element (median of 5) and a hash
of every output, for the extension at a given path (compare two builds: same hashes, times).
usage: kernels.py PATH_TO__native.so [n]"""
import sys, time, hashlib, statistics, importlib.util, importlib.machinery
import numpy as np
path = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2_400_000
loader = importlib.machinery.ExtensionFileLoader("kmod._native", path)
spec = importlib.util.spec_from_file_location("kmod._native", path, loader=loader)
nat = importlib.util.module_from_spec(spec); loader.exec_module(nat)
rng = np.random.default_rng(7)
x = (rng.standard_normal(n) * 1e-3).astype(np.float32); x[rng.random(n) < 0.3] = 0
x64 = x.astype(np.float64)
scale = (rng.random(n).astype(np.float32) * 1e-6 + 1e-9); scale[::97] = 0; scale[::101] = np.inf
pos = np.abs(rng.standard_normal(n).astype(np.float32)) * 1e-6 + 1e-12
codes = rng.integers(0, 17, n, dtype=np.uint8)
digest = hashlib.sha256()
def run(name, fn, *outs):
    times = []
    for _ in range(5):
        t = time.perf_counter(); r = fn(); times.append(time.perf_counter() - t)
    h = hashlib.sha256(repr(r).encode())
    for o in outs: h.update(np.ascontiguousarray(o).tobytes())
    digest.update(h.digest())
    print(f"{name:28s} {statistics.median(times)*1e9/n:6.2f} ns/el  {h.hexdigest()[:12]}  {str(r)[:40]}")
o32 = np.empty(n, np.float32); o64 = np.empty(n, np.float64); o8 = np.empty(n, np.int8)
cnt = np.zeros(255, np.uint64)
def rl(src, es, dith):
    cnt[:] = 0
    return nat.round_levels(src, o8, cnt, es, 2e-4, 12345, dith)
run("round_levels f32 dithered", lambda: rl(x, 4, True), o8, cnt)
run("round_levels f32 stochastic", lambda: rl(x, 4, False), o8, cnt)
run("round_levels f64 stochastic", lambda: rl(x64, 8, False), o8, cnt)
run("round_levels f32 too far", lambda: rl(x * 1000, 4, False))
sums = np.zeros(2 * 127 + 1); ub = np.zeros(2 * 127 + 1, np.uint64)
def bins(src, es, out):
    return nat.uniform_bins(src, out, sums, ub, es, 1e-3, 0.3, 127)
run("uniform_bins f32", lambda: bins(x, 4, o32), o32, sums, ub)
run("uniform_bins f64", lambda: bins(x64, 8, o64), o64, sums, ub)
for count in (7, 31, 42, 56, 69, 100, 254):
    th = np.sort(rng.standard_normal(count) * 1e-3)
    run(f"nearest_codes f32 {count}", lambda: nat.nearest_codes(x, th, o8, 4), o8)
th = np.sort(rng.standard_normal(15) * 1e-3)
run("nearest_codes f64 15", lambda: nat.nearest_codes(x64, th, o8, 8), o8)
th0 = np.zeros(0)
run("nearest_codes f64 0", lambda: nat.nearest_codes(x64, th0, o8, 8), o8)
th = np.sort(rng.standard_normal(60) * 1e-3)
run("nearest_codes f64 60", lambda: nat.nearest_codes(x64, th, o8, 8), o8)
table = rng.standard_normal(17)
run("table_lookup f32", lambda: nat.table_lookup(codes, table, o32, 4), o32)
run("table_lookup f64", lambda: nat.table_lookup(codes, table, o64, 8), o64)
run("table_lookup beyond", lambda: nat.table_lookup(codes, table[:12], o32, 4))
run("dither_shift f32 +", lambda: nat.dither_shift(x, o32, 4, 99, 3e-4, 1), o32)
run("dither_shift f64 -", lambda: nat.dither_shift(x64, o64, 8, 99, 3e-4, -1), o64)
run("step_quotients", lambda: nat.step_quotients(x, scale, o32), o32)
run("step_quotients ok", lambda: nat.step_quotients(x, pos, o32), o32)
q = o32.copy()
run("step_restore f32", lambda: nat.step_restore(q, 4, pos, o32), o32)
run("step_restore f64", lambda: nat.step_restore(q.astype(np.float64), 8, pos, o32), o32)
run("step_restore bad", lambda: nat.step_restore(x, 4, scale, o32), o32)
run("base_ratios", lambda: nat.base_ratios(x, scale, o64), o64)
run("base_ratios ok", lambda: nat.base_ratios(pos, pos[::-1].copy(), o64), o64)
r64 = o64.copy(); r32 = r64.astype(np.float32)
run("ratio_restore f64", lambda: nat.ratio_restore(r64, 8, pos, o32), o32)
run("ratio_restore f32", lambda: nat.ratio_restore(r32, 4, pos, o32), o32)
y = pos * (1 + rng.standard_normal(n).astype(np.float32) * 0.01); y[::5] = 0
run("sqrt_error_squares", lambda: nat.sqrt_error_squares(pos, y))
run("compact_nonzero f32", lambda: nat.compact_nonzero(x, o32, 4), o32)
print("all outputs", digest.hexdigest()[:16])
