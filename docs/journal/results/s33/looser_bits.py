"""Bits per parameter by state of one adaptive step-coded delta at looser budgets (gpt10m-adamw
seed 0 and minilm-full), the weights at 2.5x or 2.6x: how far the moments' budget can take the
ratio before the weights' bits cap it."""
import sys, tempfile, warnings
from pathlib import Path
sys.path.insert(0, "/work/main/benchmarks"); sys.path.insert(0, "/work/main/benchmarks/probes")
import torch, ckptzip
from fidelity import SETUPS, keyframe, STEP_BUDGET
from state_bytes import breakdown, STATES
torch.set_num_threads(2); warnings.simplefilter("ignore")
work = Path("/tmp/s33/fid"); work.mkdir(exist_ok=True)
for name in sys.argv[1].split(","):
    setup = SETUPS[name]
    key = keyframe(setup, 0, work)
    task = setup.build(0, setup.total); task.restore(ckptzip.load(key.path)); task.train(setup.every)
    state = task.state(); weights = {f"model.{n}" for n in task.param_names()}
    params = sum(p.numel() for p in task.model.parameters() if p.requires_grad)
    for w, m in ((2.5, 3), (2.5, 5), (2.5, 10), (2.5, 20), (2.6, 20), (2.6, 40)):
        budget = {"weight": w * STEP_BUDGET["weight"], "exp_avg": m * STEP_BUDGET["exp_avg"], "exp_avg_sq": m * STEP_BUDGET["exp_avg_sq"]}
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "d.ckz"
            report = ckptzip.save(state, path, mode="adaptive", base=key.path, resumed=True, pairing=task.pairing(), step_coding=True, error_budget=budget)
            bits = breakdown(path, weights, params)
        print(f"| {name} | w{w} x{m} | " + " | ".join(f"{bits[s]:.3f}" for s in STATES) + f" | {sum(bits.values()):.3f} | {key.raw_bytes / report.stored_bytes:.1f}x |", flush=True)
