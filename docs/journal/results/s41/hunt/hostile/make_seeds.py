"""Seed files for the semantic fuzzer: lossless mixed, lossless delta, lossy deltas, dir- and safetensors-sourced."""
import os, sys, json, shutil
sys.path.insert(0, "/work/main/fuzz")
import common, ckptzip, torch, fuzz_states
from ckptzip.cli import main
S = "/tmp/hunt41/hostile/seeds"
shutil.rmtree(S, ignore_errors=True); os.makedirs(S)
ckptzip.save(fuzz_states.mixed_state(), f"{S}/mixed.ckz", threads=1)
ckptzip.save(fuzz_states.base_state(), f"{S}/base.ckz", threads=1)
ckptzip.save(fuzz_states.next_state(), f"{S}/delta.ckz", base=f"{S}/base.ckz", threads=1)
for mode in ("excp", "bitsnap", "adaptive"):
    ckptzip.save(fuzz_states.next_state(), f"{S}/{mode}.ckz", base=f"{S}/base.ckz", mode=mode, threads=1)
# bigger adaptive to get lowrank/zeros/sqrt-scale stages
g = torch.Generator().manual_seed(5)
W = torch.randn(64, 48, generator=g) * 0.02
b0 = {"model": {"w": W}, "optimizer": {"state": {0: {"step": torch.tensor(1.0), "exp_avg": W * 0.1, "exp_avg_sq": W * W + 1e-8}}}}
U = torch.randn(64, 2, generator=g) @ torch.randn(2, 48, generator=g) * 1e-3
b1 = {"model": {"w": W + U}, "optimizer": {"state": {0: {"step": torch.tensor(2.0), "exp_avg": W * 0.09 + U, "exp_avg_sq": W * W * 0.99 + 1e-8}}}}
ckptzip.save(b0, f"{S}/abase.ckz", threads=1)
ckptzip.save(b1, f"{S}/adaptive2.ckz", base=f"{S}/abase.ckz", mode="adaptive", threads=1)
# directory & safetensors sources
from safetensors.torch import save_file
os.makedirs(f"{S}/srcdir/sub", exist_ok=True)
save_file({"a": torch.randn(4, 4), "b": torch.arange(6, dtype=torch.int64)}, f"{S}/srcdir/model.safetensors")
open(f"{S}/srcdir/config.json", "w").write('{"x": 1}')
open(f"{S}/srcdir/sub/notes.txt", "w").write("hello")
torch.save({"opt": torch.ones(3)}, f"{S}/srcdir/optimizer.pt")
os.makedirs(f"{S}/srcdir/emptyd")
assert main(["compress", "-q", "-o", f"{S}/dir.ckz", f"{S}/srcdir"]) == 0
save_file({"a": torch.randn(4, 4), "b": torch.arange(6, dtype=torch.int64)}, f"{S}/m.safetensors", metadata={"k": "v"})
assert main(["compress", "-q", "-o", f"{S}/st.ckz", f"{S}/m.safetensors"]) == 0
for f in sorted(os.listdir(S)):
    if f.endswith(".ckz"):
        h, _ = common.split(open(f"{S}/{f}", "rb").read())
        ids = sorted({c["id"] for p in h["pipelines"] for c in p})
        print(f, os.path.getsize(f"{S}/{f}"), ids, h.get("source", {}).get("kind"))
