import os, sys, torch, deepspeed, collections
from ckptzip.integrations import deepspeed as cds
directory, stage, dtype = sys.argv[1], int(sys.argv[2]), sys.argv[3]
PLAIN = (torch.Tensor, int, float, str, bool, bytes, type(None))
def walk(v, path, out):
    if isinstance(v, dict):
        if type(v) is not dict: out.add((path, f"dict subclass {type(v).__module__}.{type(v).__qualname__}"))
        for k, x in v.items(): walk(x, f"{path}.{k}", out)
    elif isinstance(v, (list, tuple)):
        if type(v) not in (list, tuple): out.add((path, f"seq {type(v).__module__}.{type(v).__qualname__}"))
        for i, x in enumerate(v): walk(x, f"{path}.[]", out)
    elif type(v) not in (int, float, str, bool, bytes, type(None)) and not isinstance(v, torch.Tensor):
        out.add((path, f"{type(v).__module__}.{type(v).__qualname__} {getattr(v, '__dict__', v)!r:.300}"))
class Probe(cds.CkptzipCheckpointEngine):
    def save(self, state_dict, path):
        out = set(); walk(state_dict, "", out)
        print("FILE", os.path.basename(path)); [print("  ", p, t) for p, t in sorted(out)]
        torch.save(state_dict, path)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
config = {"train_batch_size": 2, "zero_optimization": {"stage": stage},
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}}, "zero_allow_untested_optimizer": True}
if dtype != "fp32": config[dtype] = {"enabled": True}
if dtype == "fp16": config["fp16"].update({"initial_scale_power": 8})
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
engine.checkpoint_engine = Probe()
for _ in range(3):
    x = torch.randn(2, 64)
    if dtype != "fp32": x = x.to(torch.bfloat16 if dtype == "bf16" else torch.float16)
    engine.backward(engine(x).float().sum()); engine.step()
engine.save_checkpoint(directory)
