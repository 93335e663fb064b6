import torch, ckptzip, sys, hashlib
from ckptzip.hostpath import torch_ops_only
g = torch.Generator().manual_seed(3)
weight = torch.randn(256, 64, generator=g); frozen = torch.randn(8192, generator=g)
def state(scale, step):
    return {"model": {"w": weight * scale, "frozen": frozen},
            "optimizer": {"state": {0: {"step": torch.tensor(step), "exp_avg": weight * 1e-3 * scale, "exp_avg_sq": weight.square() * 1e-6 * scale},
                                    1: {"step": torch.tensor(step), "exp_avg": frozen * 1e-3, "exp_avg_sq": frozen.square() * 1e-6}},
                          "param_groups": [{"params": [0, 1], "betas": (0.9, 0.999)}]}}
ckptzip.save(state(1.0, 3.0), "/tmp/s33/k.ckz", chunk_bytes=4096)
second = state(1.01, 4.0); second["optimizer"]["state"][1]["exp_avg_sq"][-1] += 1.0
for mode in ("excp", "bitsnap", "adaptive"):
    a = ckptzip.dumps(second, mode=mode, base="/tmp/s33/k.ckz")
    with torch_ops_only():
        b = ckptzip.dumps(second, mode=mode, base="/tmp/s33/k.ckz")
    print(mode, a == b, hashlib.sha256(a).hexdigest()[:12], hashlib.sha256(b).hexdigest()[:12])
