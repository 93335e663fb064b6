"""Which torch calls let go of the GIL: each called 2,000 times while another thread runs pure Python
(which takes the GIL whenever it is let go); a call that lets go of it then waits for the other
thread to give it back. usage: release_probe.py"""
import threading, time, torch, resource, numpy as np, sys
torch.set_num_threads(1)
a = torch.ones(384, 1536); s = torch.ones(64); arr = np.ones(1000, np.float32)
ops = {"numpy": lambda: a.numpy(), "reshape": lambda: a.reshape(-1), "torch.empty": lambda: torch.empty(100), "getitem": lambda: a[:, :8],
       "float()": lambda: float(s[0]), "from_numpy": lambda: torch.from_numpy(arr), "contiguous": lambda: a.contiguous(), "np_sum_small": lambda: arr.sum(),
       "np.linalg.solve 8x8": (lambda A=np.eye(8) + 0.1, B=np.ones((8, 50)): np.linalg.solve(A, B)),
       "torch.linalg.solve 8x8": (lambda A=torch.eye(8, dtype=torch.float64) + 0.1, B=torch.ones((8, 50), dtype=torch.float64): torch.linalg.solve(A, B)),
       "item": lambda: s[3:4].item(), "s.item": lambda: s.sum().item(), "tolist": lambda: s.tolist(), "view": lambda: a.view(-1),
       "untyped_storage": lambda: a.untyped_storage(),
       "data_ptr": lambda: a.data_ptr(), "shape": lambda: a.shape, "numel": lambda: a.numel(), "detach": lambda: a.detach(),
       "is_cpu": lambda: a.is_cpu, "dtype": lambda: a.dtype, "requires_grad": lambda: a.requires_grad, "storage_offset": lambda: a.storage_offset(),
       "stride": lambda: a.stride(), "element_size": lambda: a.element_size(), "is_neg": lambda: a.is_neg(), "to_same": lambda: a.to(torch.float32),
       "frombuffer_np": lambda: torch.frombuffer(arr, dtype=torch.float32), "as_strided": lambda: a.as_strided((10,), (1,)),
       "T": lambda: a.T, "mT": lambda: a.mT, "double_small": lambda: s.double(), "add_small": lambda: s + s, "abs_small": lambda: s.abs(),
       "sum_small": lambda: s.sum(), "max_small": lambda: s.max(), "mul_scalar": lambda: s * 2.0}
stop = False
import os
def spin():
    x = 0
    while not stop: x += 1
for name, f in ops.items():
    stop = False
    t = threading.Thread(target=spin); t.start(); time.sleep(0.01)
    ru = resource.getrusage(resource.RUSAGE_SELF); t0 = time.perf_counter()
    for i in range(2000): f()
    el = time.perf_counter() - t0
    ru2 = resource.getrusage(resource.RUSAGE_SELF)
    stop = True; t.join()
    print(f"{name:22s} {el*1000/2000*1000:8.1f} us/call, vcsw {ru2.ru_nvcsw - ru.ru_nvcsw}")
