"""Count aten ops (all threads) of a lossy prepare on torch's path, run on host tensors: a CPU
proxy of the device's kernel launches; item/_local_scalar_dense and copies to numpy/host are the
device's syncs."""
import sys, tempfile, collections, time
from pathlib import Path
sys.path.insert(0, "benchmarks")
import torch
from torch.profiler import profile, ProfilerActivity
import lossy_speed, ckptzip
from ckptzip import hostpath
from ckptzip.planning import prepare
from ckptzip.reader import open_base

gb = float(sys.argv[1]) if len(sys.argv) > 1 else 0.1
modes = (sys.argv[2] if len(sys.argv) > 2 else "adaptive,excp,bitsnap").split(",")
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 1
first, second, params = lossy_speed.synthetic_states(gb)
with tempfile.TemporaryDirectory() as work:
    key = Path(work) / "k.ckz"
    ckptzip.save(first, key)
    for mode in modes:
        with hostpath.torch_ops_only():
            base = open_base(key); prepare(second, mode=mode, base=base, resumed=True, threads=threads); base.close()
            base = open_base(key)
            t = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                prepare(second, mode=mode, base=base, resumed=True, threads=threads)
            t = time.perf_counter() - t
            base.close()
        ev = [e for e in prof.events() if e.name.startswith("aten::")]
        top = [e for e in ev if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
        c = collections.Counter(e.name for e in top)
        syncs = sum(1 for e in ev if e.name == "aten::_local_scalar_dense")
        print(f"{mode}: {params/1e6:.1f}M params, top-level aten ops {len(top)}, item syncs {syncs}, {t:.2f} s")
        print("   ", c.most_common(30))
